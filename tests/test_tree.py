import pytest
import torch

from eagle3_plugin.sampler import SamplingParams
from toy import Bigram


def build(toy, batch, depth, top_k, total, temperature=0.0, sample=False, seed=0):
    params = SamplingParams.uniform(batch, temperature=temperature)
    roots = torch.arange(batch) % toy.vocab
    tree, _ = toy.one_round(roots, depth, top_k, total, params, "real" if sample else "one_hot", sample,
                            torch.Generator().manual_seed(seed))
    return tree


def test_tree_shape_and_topology():
    toy = Bigram(vocab=50, draft_vocab=40, seed=3)
    tree = build(toy, 4, depth=4, top_k=3, total=12)
    assert tree.tokens.shape == tree.parents.shape == (4, 12)
    assert (tree.parents[:, 0] == -1).all()
    idx = torch.arange(1, 12)
    assert (tree.parents[:, 1:] >= 0).all() and (tree.parents[:, 1:] < idx).all()
    depth_of_parent = tree.depths.gather(1, tree.parents[:, 1:])
    assert (tree.depths[:, 1:] == depth_of_parent + 1).all()
    assert int(tree.depths.max()) <= 4
    assert set(tree.tokens[:, 1:].flatten().tolist()) <= set(toy.hot_ids.tolist())


def test_greedy_tree_keeps_the_best_cumulative_paths():
    """Every kept node scores at least as high as every dropped candidate (EAGLE-2 rerank)."""
    toy = Bigram(vocab=30, draft_vocab=30, seed=5)
    tree = build(toy, 1, depth=2, top_k=3, total=6)
    logq = torch.log_softmax(toy.draft, dim=-1)
    root = int(tree.tokens[0, 0])
    first = torch.topk(logq[root], 3)
    scores = {(int(t),): float(s) for s, t in zip(first.values, first.indices)}
    for s1, t1 in zip(first.values, first.indices):
        second = torch.topk(logq[t1], 3)
        scores.update({(int(t1), int(t2)): float(s1 + s2) for s2, t2 in zip(second.values, second.indices)})
    best = sorted(scores.values(), reverse=True)[:5]
    kept = []
    for i in range(1, 6):
        path, node = [], i
        while node > 0:
            path.append(int(tree.tokens[0, node]))
            node = int(tree.parents[0, node])
        kept.append(scores[tuple(reversed(path))])
    assert sorted(kept, reverse=True) == best


def test_chain_is_the_top_k_1_tree():
    toy = Bigram(vocab=20, draft_vocab=20, seed=2)
    tree = build(toy, 3, depth=5, top_k=1, total=6)
    assert (tree.parents[:, 1:] == torch.arange(5)).all()
    assert (tree.depths == torch.arange(6)).all()
    for i in range(1, 6):  # each token is the draft argmax after the previous one
        assert (tree.tokens[:, i] == toy.draft[tree.tokens[:, i - 1]].argmax(-1)).all()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_one_level_tree_is_the_roots_best_children(temperature):
    """Depth 1 expands only the root: its ``total - 1`` children, best first (greedy), or drawn without replacement
    with the root's draft distribution kept (sampled)."""
    toy = Bigram(vocab=30, draft_vocab=25, seed=4)
    tree = build(toy, 3, depth=1, top_k=4, total=4, temperature=temperature, sample=temperature > 0)
    assert (tree.parents[:, 1:] == 0).all() and (tree.depths[:, 1:] == 1).all()
    assert all(len(set(row)) == 3 for row in tree.tokens[:, 1:].tolist())
    if temperature == 0.0:
        best = toy.draft[tree.tokens[:, 0]].topk(3, dim=-1).indices
        assert (tree.tokens[:, 1:] == toy.hot_ids[best]).all()
    else:
        assert torch.allclose(tree.draft_probs[:, 0].sum(-1), torch.ones(3), atol=1e-5)
        assert (tree.draft_probs[:, 1:] == 0).all()  # leaves: never expanded


def test_masks_and_paths():
    toy = Bigram(vocab=40, draft_vocab=40, seed=4)
    tree = build(toy, 2, depth=3, top_k=2, total=7, temperature=1.0, sample=True)
    mask = tree.ancestor_mask()
    paths = tree.retrieve_indices()
    for b in range(2):
        for i in range(7):
            chain, node = [], i
            while node >= 0:
                chain.append(node)
                node = int(tree.parents[b, node])
            assert set(torch.nonzero(mask[b, i]).flatten().tolist()) == set(chain)
            assert paths[b, i, : len(chain)].tolist() == list(reversed(chain))
    children = tree.children(tree.max_children())
    for b in range(2):  # children listed in index order = sampling order
        for i in range(7):
            kids = [c for c in children[b, i].tolist() if c >= 0]
            assert kids == sorted(kids) and all(int(tree.parents[b, c]) == i for c in kids)


def test_a_row_is_a_path_when_node_i_sits_at_depth_i():
    """Chains and roots alone are paths; a tree is not, unless only its path prefix counts (a tree the scheduler
    cut to its first nodes)."""
    from eagle3_plugin.tree import DraftTree
    chain = DraftTree(torch.arange(4)[None], torch.arange(4)[None] - 1, torch.arange(4)[None])
    tree = DraftTree(torch.arange(4)[None], torch.tensor([[-1, 0, 1, 0]]), torch.tensor([[0, 1, 2, 1]]))
    both = DraftTree.stack([chain, tree])
    assert both.paths().tolist() == [True, False]
    assert both.paths(torch.tensor([4, 3])).tolist() == [True, True]  # the tree's first 3 nodes: root -> 1 -> 2
    assert both.paths(torch.tensor([2, 4])).tolist() == [True, False]
    assert DraftTree.root_only(torch.tensor([5, 6])).paths().tolist() == [True, True]
    toy = Bigram(vocab=40, draft_vocab=40, seed=4)
    assert build(toy, 2, depth=3, top_k=1, total=4).paths().all()
    assert not build(toy, 2, depth=3, top_k=2, total=7).paths().any()


def test_sampled_tree_carries_the_draft_distribution_of_each_expanded_node():
    toy = Bigram(vocab=40, draft_vocab=30, seed=6)
    tree = build(toy, 8, depth=3, top_k=3, total=9, temperature=0.8, sample=True)
    has_children = torch.zeros_like(tree.tokens, dtype=torch.bool)
    has_children.scatter_(1, tree.parents[:, 1:], True)
    sums = tree.draft_probs.sum(-1)
    assert torch.allclose(sums[has_children], torch.ones(()), atol=1e-5)


def test_greedy_verification_fast_path_equals_the_general_path():
    """verify_greedy (lists) gives the verdict of verify_tree_general with one-hot p, on trees whose target
    argmax often follows a child, so that paths of every length occur."""
    from eagle3_plugin.sampler import verify_greedy, verify_tree_general
    toy = Bigram(vocab=50, draft_vocab=40, seed=7)
    gen = torch.Generator().manual_seed(0)
    lengths = set()
    for trial in range(20):
        tree = build(toy, 4, depth=4, top_k=3, total=14, seed=trial)
        logits = torch.randn(4, 14, 50, generator=gen)
        children = tree.children(tree.max_children())
        for row in range(4):
            for node in range(14):
                kids = [int(c) for c in children[row, node] if c >= 0]
                if kids and torch.rand(1, generator=gen) < 0.8:
                    pick = kids[int(torch.randint(len(kids), (1,), generator=gen))]
                    logits[row, node, tree.tokens[row, pick]] += 10.0
        for verified in (tree, tree.truncated(torch.randint(1, 15, (4,), generator=gen))):  # whole, and cut
            fast = verify_greedy(verified, logits)
            general = verify_tree_general(verified, logits, SamplingParams.uniform(4), "real")
            assert torch.equal(fast.accepted, general.accepted) and torch.equal(fast.bonus, general.bonus)
            assert torch.equal(fast.num_accepted, general.num_accepted)
            lengths |= set(fast.num_accepted.tolist())
    assert len(lengths) >= 4


def test_a_seeded_row_verifies_as_it_would_alone():
    """A row with its own generator (a seeded request) gets the verdict it gets alone, whatever else the batch holds:
    greedy rows whose paths go deeper keep the batched loop running after the row stopped, and the row draws nothing
    from its generator there."""
    from eagle3_plugin.rng import RowRandom
    from eagle3_plugin.sampler import verify_tree_general
    toy = Bigram(vocab=50, draft_vocab=40, seed=10)
    gen = torch.Generator().manual_seed(3)
    for trial in range(12):
        tree = build(toy, 4, depth=4, top_k=3, total=14, temperature=0.9, sample=True, seed=trial)
        logits = torch.randn(4, 14, 50, generator=gen)
        for row in (1, 2, 3):  # greedy rows that accept their first children down to the last level
            for node in range(14):
                kids = torch.nonzero(tree.parents[row] == node)[:, 0]
                if len(kids):
                    logits[row, node, tree.tokens[row, kids[0]]] += 20.0
        params = SamplingParams(torch.tensor([0.9, 0.0, 0.0, 0.9]), torch.zeros(4, dtype=torch.long), torch.ones(4))
        shared = RowRandom(torch.Generator().manual_seed(1), {0: torch.Generator().manual_seed(5)})
        batched = verify_tree_general(tree, logits, params, "real", shared)
        own = RowRandom(torch.Generator().manual_seed(2), {0: torch.Generator().manual_seed(5)})
        alone = verify_tree_general(tree.select(torch.tensor([0])), logits[:1], SamplingParams.uniform(1, 0.9), "real",
                                    own)
        assert batched.accepted[0].tolist() == alone.accepted[0].tolist(), trial
        assert int(batched.bonus[0]) == int(alone.bonus[0]), trial


def test_seeded_rows_where_reads_the_seeded_rows_flags_only():
    """The rows with their own generator whose flag is set, ascending, whatever the dict's order; none unseeded."""
    from eagle3_plugin.rng import RowRandom
    random = RowRandom(None, {4: torch.Generator(), 1: torch.Generator(), 2: torch.Generator()})
    assert random.seeded_rows_where(torch.tensor([True, True, False, True, True, False])) == [1, 4]
    assert RowRandom(None).seeded_rows_where(torch.ones(3, dtype=torch.bool)) == []


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_verification_over_flat_rows_equals_verification_of_the_trees_rows(temperature):
    """verify_tree_rows (an engine's flat logits and each node's row in them) decides as verify_tree does on the
    tree's rows copied out, greedy (argmax fast path) and sampled."""
    from eagle3_plugin.sampler import verify_tree, verify_tree_rows
    toy = Bigram(vocab=50, draft_vocab=40, seed=9)
    tree = build(toy, 4, depth=4, top_k=3, total=14, temperature=temperature, sample=temperature > 0)
    gen = torch.Generator().manual_seed(1)
    flat = torch.randn(4 * 14 + 5, 50, generator=gen)
    rows = torch.randperm(flat.shape[0], generator=gen)[:4 * 14].view(4, 14)
    params = SamplingParams.uniform(4, temperature=temperature)
    want = verify_tree(tree, flat[rows], params, "real", torch.Generator().manual_seed(2))
    got = verify_tree_rows(tree, flat, rows, params, "real", torch.Generator().manual_seed(2))
    assert torch.equal(got.accepted, want.accepted) and torch.equal(got.bonus, want.bonus)


def test_stable_topk_fast_path_matches_a_stable_sort():
    from eagle3_plugin.tree import _stable_topk
    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        if trial % 2:  # small integers: many ties
            x = torch.randint(0, 6, (3, 4, 40), generator=gen).float()
        else:
            x = torch.randn(3, 4, 40, generator=gen)
        values, ids = _stable_topk(x, 5)
        want_values, want_ids = torch.sort(x, dim=-1, descending=True, stable=True)
        assert torch.equal(values, want_values[..., :5]) and torch.equal(ids, want_ids[..., :5])


def test_stable_topk_with_an_offset_is_that_of_the_sum():
    """Top-k of ``offset + x`` from the top k + 1 of ``x``: also where adding the offset rounds distinct values to
    equal ones (large offsets: each row's ties then go to the lower index, as the sum's stable sort has them), inside
    the top k only (ordered there) or at its edge (the full sort)."""
    from eagle3_plugin.tree import _stable_topk
    gen = torch.Generator().manual_seed(1)
    inside, at_edge = 0, 0
    for trial in range(200):
        x = torch.log_softmax(torch.randn(3, 4, 40, generator=gen) * (1 + trial % 5), dim=-1)
        offset = torch.randn(3, 4, 1, generator=gen) * 10.0 ** (trial % 9)
        values, ids = _stable_topk(x, 5, offset=offset)
        want_values, want_ids = torch.sort(offset + x, dim=-1, descending=True, stable=True)
        assert torch.equal(values, want_values[..., :5]) and torch.equal(ids, want_ids[..., :5])
        edge = bool((want_values[..., 4] == want_values[..., 5]).any())
        at_edge += edge
        inside += not edge and bool((want_values[..., 1:5] == want_values[..., :4]).any())
    assert inside > 0 and at_edge > 0  # both ways of breaking the ties were exercised


def test_keyed_topk_is_the_stable_sort():
    """The GPU's top-k (values and indices packed in int64 keys, no host read) gives the stable sort's top k: ties
    (many, from coarse values), -0.0 beside +0.0, -inf, and values of any magnitude and sign."""
    from eagle3_plugin.tree import _keyed_topk
    gen = torch.Generator().manual_seed(2)
    for trial in range(60):
        x = torch.randn(3, 4, 64, generator=gen) * 10.0 ** (trial % 7 - 3)
        if trial % 3 == 1:
            x = x.round()  # many exact ties
        if trial % 3 == 2:
            x[..., ::5] = -0.0
            x[..., 1::5] = 0.0
            x[..., 2::7] = float("-inf")
        values, ids = _keyed_topk(x, 9)
        want_values, want_ids = torch.sort(x, dim=-1, descending=True, stable=True)
        assert torch.equal(ids, want_ids[..., :9]) and torch.equal(values, want_values[..., :9])


def test_chain_fast_path_is_the_top_k_1_tree():
    """build_chain gives build_tree's chain: same tokens, and at T > 0 the same draws and draft distributions."""
    from eagle3_plugin.tree import build_chain, build_tree
    toy = Bigram(vocab=60, draft_vocab=45, seed=8)

    def expand(level, tokens, parent_slot):
        return toy.draft[tokens]

    roots = torch.arange(6) % toy.vocab
    temperature = torch.tensor([0.0, 1.0, 0.7, 0.0, 1.3, 1.0])
    for sample in (False, True):
        for seed in range(5):
            args = (roots, toy.draft[roots], expand)
            tree = build_tree(*args, 4, 1, 5, temperature, sample, toy.hot_ids, torch.Generator().manual_seed(seed))
            chain = build_chain(*args, 4, temperature, sample, toy.hot_ids, torch.Generator().manual_seed(seed))
            for name in ("tokens", "parents", "depths"):
                assert torch.equal(getattr(tree, name), getattr(chain, name))
            assert (tree.draft_probs is None) == (chain.draft_probs is None) == (not sample)
            if sample:
                assert torch.allclose(tree.draft_probs, chain.draft_probs)


def test_leading_paths_cut_the_chosen_rows_to_their_first_children():
    from eagle3_plugin.tree import build_chain
    toy = Bigram(vocab=60, draft_vocab=45, seed=8)
    for temperature, sample in ((0.0, False), (1.0, True)):
        tree = build(toy, 6, depth=4, top_k=3, total=12, temperature=temperature, sample=sample, seed=1)
        rows = torch.tensor([True, False, True, True, False, True])
        cut, counts = tree.leading_paths(rows)
        assert torch.equal(counts[~rows], torch.full((2,), 12))
        for name in ("tokens", "parents", "depths"):
            assert torch.equal(getattr(cut, name)[~rows], getattr(tree, name)[~rows])
        assert bool(cut.paths(counts)[rows].all())
        first = tree.children(1)[..., 0]
        for row in torch.nonzero(rows)[:, 0].tolist():
            node, path = 0, [0]
            while int(first[row, node]) >= 0:
                node = int(first[row, node])
                path.append(node)
            assert int(counts[row]) == len(path)
            assert cut.tokens[row, :len(path)].tolist() == tree.tokens[row, path].tolist()
            assert (cut.parents[row, len(path):] == -1).all() and (cut.depths[row, len(path):] == 0).all()
            if sample:
                assert torch.equal(cut.draft_probs[row, :len(path)], tree.draft_probs[row, path])
                assert (cut.draft_probs[row, len(path):] == 0).all()
    # greedy: the leading path is a prefix of the draft's greedy chain
    roots = torch.arange(6) % toy.vocab
    greedy = build(toy, 6, depth=4, top_k=3, total=12)
    chain = build_chain(roots, toy.draft[roots], lambda level, tokens, slot: toy.draft[tokens], 4,
                        torch.zeros(6), False, toy.hot_ids)
    cut, counts = greedy.leading_paths(torch.ones(6, dtype=torch.bool))
    for row in range(6):
        n = int(counts[row])
        assert n >= 2 and cut.tokens[row, :n].tolist() == chain.tokens[row, :n].tolist()
