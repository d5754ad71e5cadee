"""The batched speculator drafts each row exactly as it would alone: same store contents, same trees, greedy and
sampled (each row with its own generator), over steps of ragged prompt chunks and accepted paths, with short and
long rows in one step (two catch-up groups) and slots scattered like a paged cache's."""

import pytest
import torch

from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.rng import RowRandom
from eagle3_plugin.sampler import SamplingParams
from eagle3_plugin.speculator import SHORT_ROW, DraftKV, DraftRows, Speculator, TreeShape

CONFIG = Eagle3Config(depth=4, top_k=3, total_tokens=12)


@pytest.fixture
def speculator(target, draft):
    draft.attach_embedding(target.get_input_embeddings())
    return Speculator(draft, CONFIG)


def histories(batch, steps, vocab, feature_size, seed=0):
    """Per row, per step: (number of new entries, tokens, features); the first step is a long prompt chunk for
    some rows, so short and long rows meet in one step."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for row in range(batch):
        counts = [int(torch.randint(20, 40, (1,), generator=g)) if row % 2 else 3]
        counts += [int(torch.randint(1, CONFIG.depth + 2, (1,), generator=g)) for _ in range(steps - 1)]
        out.append([(n, torch.randint(3, vocab, (n,), generator=g), torch.randn(n, feature_size, generator=g))
                    for n in counts])
    return out


def run(speculator, rows_history, slots_per_row, params, seeds, kv, gathered=False):
    """Drive ``speculator`` over the given rows together; returns the trees of every step. ``gathered``: features
    handed as an engine does, a table of the step's entries (in scrambled order) and each entry's row in it."""
    b = len(rows_history)
    start = torch.zeros(b, dtype=torch.long)
    trees = []
    randoms = RowRandom(None, {r: torch.Generator().manual_seed(s) for r, s in enumerate(seeds)})
    for step in range(len(rows_history[0])):
        entries = [h[step] for h in rows_history]
        q = max(n for n, _, _ in entries)
        tokens = torch.zeros(b, q, dtype=torch.long)
        features = torch.zeros(b, q, entries[0][2].shape[1])
        for r, (n, t, f) in enumerate(entries):
            tokens[r, :n], features[r, :n] = t, f
        count = torch.tensor([n for n, _, _ in entries])
        if gathered:
            order = torch.randperm(b * q, generator=torch.Generator().manual_seed(step))
            table = torch.empty_like(features.flatten(0, 1))
            table[order] = features.flatten(0, 1)
            rows = DraftRows(slots_per_row, start.clone(), count, tokens, table, order.view(b, q))
        else:
            rows = DraftRows(slots_per_row, start.clone(), count, tokens, features)
        trees.append(speculator.step(kv, rows, params, randoms))
        start += count
    return trees


@pytest.mark.parametrize("temperature, gathered", [(0.0, False), (0.8, False), (0.8, True)])
def test_batched_rows_draft_as_they_would_alone(speculator, target, temperature, gathered):
    batch, steps, span = 5, 4, 80
    c = speculator.draft.config
    history = histories(batch, steps, target.config.vocab_size, 3 * c.target_hidden_size)
    assert max(h[0][0] for h in history) > SHORT_ROW >= min(h[0][0] for h in history)
    perm = torch.randperm(batch * span, generator=torch.Generator().manual_seed(1))  # scattered slots
    slots = perm.view(batch, span)
    params = SamplingParams.uniform(batch, temperature=temperature)
    seeds = list(range(10, 10 + batch))
    together_kv = DraftKV.allocate(batch * span, c.num_key_value_heads, c.head_dim, torch.float32)
    together = run(speculator, history, slots, params, seeds, together_kv, gathered)
    for row in range(batch):
        alone_kv = DraftKV.allocate(batch * span, c.num_key_value_heads, c.head_dim, torch.float32)
        alone = run(speculator, [history[row]], slots[row:row + 1], params.select(torch.tensor([row])),
                    [seeds[row]], alone_kv)
        written = slots[row, :sum(n for n, _, _ in history[row])]
        assert torch.allclose(together_kv.keys[written], alone_kv.keys[written], atol=1e-5)
        for t_all, t_one in zip(together, alone):
            assert torch.equal(t_all.tokens[row], t_one.tokens[0])
            assert torch.equal(t_all.parents[row], t_one.parents[0])
            if temperature > 0:
                assert torch.allclose(t_all.draft_probs[row], t_one.draft_probs[0], atol=1e-5)


def test_catch_up_only_and_smaller_shapes(speculator, target):
    c = speculator.draft.config
    kv = DraftKV.allocate(64, c.num_key_value_heads, c.head_dim, torch.float32)
    rows = DraftRows(torch.arange(64).view(2, 32), torch.zeros(2, dtype=torch.long), torch.tensor([5, 3]),
                     torch.randint(3, target.config.vocab_size, (2, 5)), torch.randn(2, 5, 3 * c.target_hidden_size))
    params = SamplingParams.uniform(2)
    assert speculator.step(kv, rows, params, shape=TreeShape(CONFIG.depth, 1, 1)) is None
    assert kv.keys.abs().sum() == 0  # deferred: stored before the next tree is grown
    chain = speculator.step(kv, DraftRows(rows.slots, rows.count, torch.ones(2, dtype=torch.long),
                                          rows.tokens[:, :1], rows.features[:, :1]), params, shape=TreeShape(3, 1, 4))
    assert kv.keys[:6].abs().sum() > 0 and kv.keys[32:36].abs().sum() > 0 and kv.keys[36:].abs().sum() == 0
    assert chain.tokens.shape == (2, 4) and (chain.parents[:, 1:] == torch.arange(3)).all()


def alone_store(draft, kv, rows):
    """What storing ``rows`` alone gives: each row's new entries through the draft's forward, keys and values kept
    at their slots (the plain reference of the deferred store)."""
    from eagle3_plugin.draft import ConcatAttention
    for b in range(rows.tokens.shape[0]):
        n, start = int(rows.count[b]), int(rows.start[b])
        attention = ConcatAttention(scale=draft.attention_scale)
        draft(rows.tokens[b:b + 1, :n], draft.fuse(rows.padded_features()[b:b + 1, :n]),
              torch.arange(start, start + n)[None], attention)
        kv.keys[rows.slots[b, start:start + n]] = attention.keys[0].transpose(0, 1)
        kv.values[rows.slots[b, start:start + n]] = attention.values[0].transpose(0, 1)


def test_steps_without_a_tree_store_their_entries_together_exactly(speculator, target):
    """Steps that grow no tree are stored in one forward, after DEFER_STEPS of them, once DEFER_ENTRIES wait, or on
    flush, with the keys and values the draft's forward gives each entry; the features are the entries' own (the
    engine's table may change after the step)."""
    from eagle3_plugin.speculator import DEFER_ENTRIES, DEFER_STEPS, Speculator
    speculator = Speculator(speculator.draft, speculator.config)  # nothing deferred by other tests
    c = speculator.draft.config
    g = torch.Generator().manual_seed(3)
    span = DEFER_STEPS + 2  # positions per row: row 0's position p in slot p, row 1's scattered after them
    slots = torch.stack([torch.arange(span), span + torch.randperm(span, generator=g)])
    steps = [DraftRows(slots, torch.tensor([i, i]), torch.ones(2, dtype=torch.long),
                       torch.randint(3, target.config.vocab_size, (2, 1), generator=g),
                       torch.randn(2, 1, 3 * c.target_hidden_size, generator=g)) for i in range(span)]
    params, none = SamplingParams.uniform(2), TreeShape(1, 1, 1)
    alone = DraftKV.allocate(2 * span, c.num_key_value_heads, c.head_dim, torch.float32)
    for rows in steps:
        alone_store(speculator.draft, alone, rows)
    deferred = DraftKV.allocate(2 * span, c.num_key_value_heads, c.head_dim, torch.float32)
    table = torch.empty(2, 3 * c.target_hidden_size)  # as an engine hands features: one table, reused each step
    for i, rows in enumerate(steps):
        table.copy_(rows.features[:, 0])
        speculator.step(deferred, DraftRows(rows.slots, rows.start, rows.count, rows.tokens, table,
                                            torch.arange(2)[:, None]), params, shape=none)
        table.zero_()  # the engine's next step overwrites it: deferred entries kept their own copy
        if i == DEFER_STEPS - 2:
            assert deferred.keys.abs().sum() == 0
    assert deferred.keys[:DEFER_STEPS].abs().sum() > 0 and deferred.keys[DEFER_STEPS:span].abs().sum() == 0
    speculator.flush()
    assert torch.allclose(deferred.keys, alone.keys, atol=1e-5) and torch.allclose(deferred.values, alone.values,
                                                                                   atol=1e-5)
    long_rows = DraftRows(torch.arange(2 * DEFER_ENTRIES).view(2, DEFER_ENTRIES), torch.tensor([12, 0]),
                          torch.tensor([1, DEFER_ENTRIES - 1]),
                          torch.randint(3, target.config.vocab_size, (2, DEFER_ENTRIES - 1), generator=g),
                          torch.randn(2, DEFER_ENTRIES - 1, 3 * c.target_hidden_size, generator=g))
    big = DraftKV.allocate(2 * DEFER_ENTRIES, c.num_key_value_heads, c.head_dim, torch.float32)
    speculator.step(big, long_rows, params, shape=none)  # DEFER_ENTRIES wait: stored at once
    expected = DraftKV.allocate(2 * DEFER_ENTRIES, c.num_key_value_heads, c.head_dim, torch.float32)
    alone_store(speculator.draft, expected, long_rows)
    assert speculator._deferred == [] and torch.allclose(big.keys, expected.keys, atol=1e-5)


def test_proposed_trees_are_kept_per_request():
    """A step that proposes for some requests (new prompts) keeps the others' trees; batches of different widths
    come back padded with detached nodes."""
    from eagle3_plugin.proposed_trees import ProposedTrees
    from eagle3_plugin.tree import DraftTree

    def trees(b, n, first):
        nodes = torch.arange(n).expand(b, n)
        return DraftTree(first + torch.arange(b)[:, None] * 10 + nodes, nodes - 1, nodes.clone())

    proposed = ProposedTrees()
    proposed.set(trees(3, 4, 100), ["a", "b", "c"])
    proposed.set(trees(1, 6, 500), ["d"])
    got, found = proposed.get(["c", "d", "a", "x"])
    assert found.tolist() == [True, True, True, False]
    assert got.tokens[0].tolist() == [120, 121, 122, 123, 0, 0] and got.parents[0, 4:].tolist() == [-1, -1]
    assert got.tokens[1].tolist() == list(range(500, 506)) and got.tokens[2, :4].tolist() == [100, 101, 102, 103]
    assert torch.equal(proposed.get(["a", "b", "c"])[0].tokens, trees(3, 4, 100).tokens)  # as proposed
    assert proposed.get(["b", "c"])[0].tokens[:, 0].tolist() == [110, 120]  # one step's rows, some finished
    assert proposed.get(["b", "a", "c"])[0].tokens[:, 0].tolist() == [110, 100, 120]  # the batch reordered
    proposed.drop(["a"])
    assert proposed.get(["a"])[1].tolist() == [False]


def test_proposed_trees_of_greedy_and_sampling_steps_mix():
    """Trees drafted in a step without sampling rows (no draft probabilities) stack with ones that have them."""
    from eagle3_plugin.proposed_trees import ProposedTrees
    from eagle3_plugin.tree import DraftTree
    nodes = torch.arange(3).expand(1, 3)
    greedy = DraftTree(nodes.clone(), nodes - 1, nodes.clone())
    sampled = DraftTree(nodes + 5, nodes - 1, nodes.clone(), torch.full((1, 3, 4), 0.25), torch.arange(4))
    proposed = ProposedTrees()
    proposed.set(greedy, ["g"])
    proposed.set(sampled, ["s"])
    got, _ = proposed.get(["g", "s"])
    assert got.draft_probs.shape == (2, 3, 4) and got.draft_probs[0].sum() == 0 and got.draft_probs[1].sum() == 3
    assert torch.equal(got.hot_ids, torch.arange(4))


def test_measuring_the_draft_costs_at_start_up_leaves_nothing_behind(speculator):
    """An engine's start-up measurement times every shape of an auto budget (none included, which defers) on its
    own synthetic store: no synthetic entry stays deferred to land in the engine's store later."""
    import dataclasses

    from eagle3_plugin.budget import NONE, TreeBudget
    fixed = Speculator(speculator.draft, dataclasses.replace(CONFIG, budget="fixed"))
    assert TreeBudget.for_speculator(fixed, torch.float32, "cpu").draft_costs == {}
    auto = Speculator(speculator.draft, CONFIG)  # auto, the default
    budget = TreeBudget.for_speculator(auto, torch.float32, "cpu")
    assert set(budget.draft_costs) == set(budget.shapes) and NONE in budget.shapes and auto._deferred == []
    assert budget.draft_costs[budget.shapes[0]](8) > budget.draft_costs[NONE](8)


@pytest.mark.parametrize("shape", [TreeShape(4, 1, 5), TreeShape(4, 3, 12)])
def test_a_greedy_chain_is_what_the_draft_predicts_token_by_token(speculator, target, shape):
    """The chain (and a tree's first-child path) against the draft run one token at a time over the whole sequence,
    plain causal attention, no store, no masks: each node is the argmax after its parent. A tree need not keep the
    whole chain (a node's best child may score below other branches' nodes)."""
    from eagle3_plugin.draft import ConcatAttention

    draft, c = speculator.draft, speculator.draft.config
    g = torch.Generator().manual_seed(3)
    b, n = 2, 7
    tokens = torch.randint(3, target.config.vocab_size, (b, n), generator=g)
    features = torch.randn(b, n, 3 * c.target_hidden_size, generator=g)
    kv = DraftKV.allocate(2 * 32, c.num_key_value_heads, c.head_dim, torch.float32)
    rows = DraftRows(torch.arange(64).view(2, 32), torch.zeros(b, dtype=torch.long), torch.full((b,), n), tokens,
                     features)
    with torch.inference_mode():
        tree = speculator.step(kv, rows, SamplingParams.uniform(b), shape=shape)
        attention = ConcatAttention(scale=draft.attention_scale)
        hidden = draft(tokens, draft.fuse(features), torch.arange(n).expand(b, -1), attention)[:, -1:]
        expected = [tokens[:, -1]]
        for level in range(1, shape.depth + 1):
            expected.append(draft.hot_token_ids[draft.logits(hidden[:, 0]).argmax(-1)])
            if level < shape.depth:
                hidden = draft(expected[-1][:, None], hidden, torch.full((b, 1), n - 1 + level), attention)
    expected = torch.stack(expected, 1)
    for row in range(b):  # the tree's first-child path from the root, as deep as the tree kept it
        node, path = 0, [int(tree.tokens[row, 0])]
        while bool((tree.parents[row] == node).any()):
            node = int(torch.nonzero(tree.parents[row] == node)[0, 0])
            path.append(int(tree.tokens[row, node]))
        assert path == expected[row, :len(path)].tolist() and len(path) >= 2
        assert shape.top_k > 1 or len(path) == shape.depth + 1


@pytest.mark.parametrize("shape", [TreeShape(4, 1, 5), TreeShape(4, 3, 12)])
def test_a_greedy_chain_under_output_rules_is_the_draft_with_their_masks_token_by_token(speculator, target, shape):
    """With rules, each node of the chain (a tree's first-child path) is the draft's argmax after its parent once the
    rules meant for a draft are applied for the path so far: ids banned, a stop id held back for ``min_tokens``, a
    bias. Their penalties are the target's alone (a frequency penalty of 100 here would forbid every repeat)."""
    from eagle3_plugin.draft import ConcatAttention
    from eagle3_plugin.output_rules import HeldBack, OutputRules

    draft, c = speculator.draft, speculator.draft.config
    v, hot = target.config.vocab_size, speculator.draft.hot_token_ids
    g = torch.Generator().manual_seed(3)
    b, n = 2, 7
    tokens = torch.randint(3, v, (b, n), generator=g)
    features = torch.randn(b, n, 3 * c.target_hidden_size, generator=g)
    banned = torch.zeros(b, v, dtype=torch.bool)
    bias = torch.zeros(b, v).index_fill_(1, hot[torch.randperm(hot.numel(), generator=g)[:hot.numel() // 4]], 3.0)
    with torch.inference_mode():
        attention = ConcatAttention(scale=draft.attention_scale)
        hidden = draft(tokens, draft.fuse(features), torch.arange(n).expand(b, -1), attention)[:, -1:]
        first, second = hot[draft.logits(hidden[:, 0]).topk(2).indices].unbind(-1)
        banned[torch.arange(b), first] = True  # the draft's own first choice, everywhere
        rules = OutputRules(v, [[] for _ in range(b)], prompt=torch.full((b, 1), v), presence=torch.zeros(b),
                            frequency=torch.full((b,), 100.0), repetition=torch.ones(b), banned=banned,
                            held_back={0: HeldBack(2, [int(second[0])])},  # row 0: its second choice, at depth < 2
                            bias=bias)
        kv = DraftKV.allocate(2 * 32, c.num_key_value_heads, c.head_dim, torch.float32)
        rows = DraftRows(torch.arange(64).view(2, 32), torch.zeros(b, dtype=torch.long), torch.full((b,), n), tokens,
                         features)
        tree = speculator.step(kv, rows, SamplingParams.uniform(b), shape=shape, rules=rules)
        expected = [tokens[:, -1]]
        for level in range(1, shape.depth + 1):
            x = (draft.logits(hidden[:, 0]).float() + bias[:, hot]).masked_fill(banned[:, hot], float("-inf"))
            if level <= 2:
                x[0, hot == second[0]] = float("-inf")
            expected.append(hot[x.argmax(-1)])
            if level < shape.depth:
                hidden = draft(expected[-1][:, None], hidden, torch.full((b, 1), n - 1 + level), attention)
    expected = torch.stack(expected, 1)
    assert int(expected[0, 1]) != int(second[0])
    assert bool((bias.gather(1, expected[:, 1:]) > 0).any())  # the bias chose some of them
    for row in range(b):
        node, path = 0, [int(tree.tokens[row, 0])]
        while bool((tree.parents[row] == node).any()):
            node = int(torch.nonzero(tree.parents[row] == node)[0, 0])
            path.append(int(tree.tokens[row, node]))
        assert path == expected[row, :len(path)].tolist() and len(path) >= 2
        assert int(first[row]) not in tree.tokens[row, 1:].tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masks_that_leave_fewer_ids_than_top_k_still_grow_a_tree(speculator, target, temperature):
    """Rules that allow two of the draft's ids, under a top_k of 3 (a served request with allowed_token_ids stopped
    the engine this way when masked logits were -inf: an -inf parent's Gumbel is NaN). Every allowed id is proposed
    first; the rest of each node's children carry draft probability 0, which verification always rejects."""
    from eagle3_plugin.output_rules import OutputRules

    c = speculator.draft.config
    v, hot = target.config.vocab_size, speculator.draft.hot_token_ids
    b, n = 3, 6
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(3, v, (b, n), generator=g)
    features = torch.randn(b, n, 3 * c.target_hidden_size, generator=g)
    allowed = hot[[5, 9]]
    banned = torch.ones(b, v, dtype=torch.bool)
    banned[:, allowed] = False
    kv = DraftKV.allocate(b * 32, c.num_key_value_heads, c.head_dim, torch.float32)
    rows = DraftRows(torch.arange(b * 32).view(b, 32), torch.zeros(b, dtype=torch.long), torch.full((b,), n), tokens,
                     features)
    random = RowRandom(None, {r: torch.Generator().manual_seed(r) for r in range(b)})
    tree = speculator.step(kv, rows, SamplingParams.uniform(b, temperature=temperature), random,
                           shape=TreeShape(4, 3, 12), rules=OutputRules(v, [[] for _ in range(b)], banned=banned))
    for row in range(b):
        children = [set(tree.tokens[row][tree.parents[row] == node].tolist()) for node in range(12)]
        assert children[0] >= set(allowed.tolist())  # the root's children: both allowed ids, then masked ones
    if temperature > 0:
        assert torch.isfinite(tree.draft_probs).all()
        q_allowed = tree.draft_probs[..., [5, 9]].sum(-1)
        expanded = tree.draft_probs.sum(-1) > 0
        assert torch.allclose(q_allowed[expanded], torch.ones_like(q_allowed[expanded]))


class _AlternatingGrammar:
    """A toy ``PathGrammars``: after a path of even length a row may emit only ``even`` ids, after an odd one only
    ``odd`` ids; it records every path it was asked about."""

    def __init__(self, rows, even, odd, vocab_size, whole_tree=False):
        self.rows, self.even, self.odd, self.vocab_size, self.asked = rows, even, odd, vocab_size, []
        self.whole_tree = whole_tree

    def allowed_after(self, rows, paths, columns=None):
        self.asked.append(list(zip(rows, map(tuple, paths))))
        allowed = torch.zeros(len(rows), self.vocab_size, dtype=torch.bool)
        for i, path in enumerate(paths):
            allowed[i, self.odd if len(path) % 2 else self.even] = True
        return allowed if columns is None else allowed[:, columns]


def _draft_under_grammar(speculator, target, temperature, whole_tree, depth=4, grammar_rows=(0, 2)):
    """Three rows, ``grammar_rows`` under an :class:`_AlternatingGrammar`, drafted as trees ``depth``/3/16: the tree,
    the grammar and its two id sets."""
    from eagle3_plugin.output_rules import OutputRules

    c = speculator.draft.config
    v, hot = target.config.vocab_size, speculator.draft.hot_token_ids
    b, n = 3, 6
    g = torch.Generator().manual_seed(6)
    tokens = torch.randint(3, v, (b, n), generator=g)
    features = torch.randn(b, n, 3 * c.target_hidden_size, generator=g)
    even, odd = hot[[4, 7, 11]].tolist(), hot[[2, 13]].tolist()
    grammar = _AlternatingGrammar(list(grammar_rows), even, odd, v, whole_tree)
    kv = DraftKV.allocate(b * 32, c.num_key_value_heads, c.head_dim, torch.float32)
    rows = DraftRows(torch.arange(b * 32).view(b, 32), torch.zeros(b, dtype=torch.long), torch.full((b,), n), tokens,
                     features)
    random = RowRandom(None, {r: torch.Generator().manual_seed(r) for r in range(b)})
    tree = speculator.step(kv, rows, SamplingParams.uniform(b, temperature=temperature), random,
                           shape=TreeShape(depth, 3, 16),
                           rules=OutputRules(v, [[] for _ in range(b)], grammars=grammar))
    return tree, grammar, even, odd


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_grammar_masks_each_rows_leading_path_only(speculator, target, temperature):
    """Where an engine verifies a grammar row's drafts along its tree's leading path (vLLM:
    ``DraftTree.leading_paths``), the grammar is read there only, once per level: that path obeys it, the row's other
    nodes and the other rows do not have to."""
    depth = 4
    tree, grammar, even, odd = _draft_under_grammar(speculator, target, temperature, whole_tree=False, depth=depth)
    chains, counts = tree.leading_paths(torch.tensor([True, False, True]))
    for row in (0, 2):
        path = chains.tokens[row, 1:counts[row]].tolist()
        assert len(path) >= 2
        assert all(t in (odd if i % 2 else even) for i, t in enumerate(path)), path
    assert [len(asked) for asked in grammar.asked] == [2] * len(grammar.asked)  # one node a row a level
    assert len(grammar.asked) <= depth
    leading = [asked[0][1] for asked in grammar.asked]  # row 0's paths, level by level: its leading path's prefixes
    assert leading == [tuple(chains.tokens[0, 1:1 + i].tolist()) for i in range(len(leading))]
    other = tree.tokens[1, 1:].tolist()  # a row without a grammar proposes ids the grammar would not allow
    assert set(other) - set(even) - set(odd)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("grammar_rows", [(0, 2), (0, 1, 2)])
def test_a_grammar_verified_over_the_whole_tree_masks_every_node(speculator, target, temperature, grammar_rows):
    """Where an engine verifies every node of a grammar row's tree under the grammar (SGLang), every frontier node's
    grammar is read, and every node the row drafts obeys it where the grammar leaves at least ``top_k`` ids (3 here:
    the even ids; after an odd path 2 ids, so the third child of such a node is a masked id the target rejects).
    Some rows under a grammar, or all of them."""
    tree, grammar, even, odd = _draft_under_grammar(speculator, target, temperature, True, grammar_rows=grammar_rows)
    for row in grammar_rows:
        parents, depths, tokens = tree.parents[row].tolist(), tree.depths[row].tolist(), tree.tokens[row].tolist()
        checked = 0
        for node in range(1, len(tokens)):
            rank = sum(parents[other] == parents[node] for other in range(1, node))  # children come in score order
            allowed = odd if (depths[node] - 1) % 2 else even  # after the parent's path below the root
            if rank < len(allowed):
                assert tokens[node] in allowed, (row, node, tokens[node])
                checked += 1
        assert checked >= 8
    asked_rows = [sorted({row for row, _ in asked}) for asked in grammar.asked]
    assert all(rows == list(grammar_rows) for rows in asked_rows)
    assert max(len(asked) for asked in grammar.asked) == len(grammar_rows) * 3  # every frontier node (top_k 3)
    if 1 not in grammar_rows:
        other = tree.tokens[1, 1:].tolist()
        assert set(other) - set(even) - set(odd)
