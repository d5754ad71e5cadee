"""The output rules on a draft tree equal the rules applied to each node alone, with its context written out: the
row's emitted tokens then the path's draft tokens below the root (what the engine would have emitted)."""

from collections import Counter

import pytest
import torch

from eagle3_plugin.output_rules import HeldBack, OutputRules
from eagle3_plugin.tree import DraftTree
from random_trees import random_trees

V, N = 40, 12


def node_context(tree: DraftTree, row: int, node: int, emitted: list[int]) -> list[int]:
    path = []
    while node > 0:
        path.append(int(tree.tokens[row, node]))
        node = int(tree.parents[row, node])
    return emitted + path[::-1]


def one_node(x: torch.Tensor, context: list[int], depth: int, row: int, rules: OutputRules) -> torch.Tensor:
    """The rules for one node's logits ``x [V]``, from their definitions."""
    x = x.clone()
    if rules.banned is not None:
        x[rules.banned[row]] = float("-inf")
    for word in rules.bad_words.get(row, []):
        if len(word) == 1 or context[-(len(word) - 1):] == word[:-1]:
            x[word[-1]] = float("-inf")
    held = rules.held_back.get(row)
    if held is not None and depth < held.remaining:
        before = x.clone()
        x[held.stop_ids] = float("-inf")
        if held.restore and bool(torch.isneginf(x).all()):
            x[held.stop_ids] = before[held.stop_ids]
    if rules.bias is not None and rules.arithmetic == "vllm":  # vLLM's LogitBiasLogitsProcessor, before penalties
        x = x + rules.bias[row]
    if rules.prompt is not None and rules.arithmetic == "sglang":
        x = sglang_penalised(x, context, row, rules)
    elif rules.prompt is not None:
        counts = Counter(context)
        count = torch.tensor([counts[t] for t in range(V)])
        in_prompt = torch.tensor([t in set(rules.prompt[row].tolist()) for t in range(V)])
        penalty = torch.where(in_prompt | (count > 0), rules.repetition[row], 1.0)
        x = x * torch.where(x > 0, 1.0 / penalty, penalty)
        x = x - rules.frequency[row] * count
        x = x - rules.presence[row] * (count > 0)
    if rules.bias is not None and rules.arithmetic == "sglang":  # SGLang adds it last
        x = x + rules.bias[row]
    return x


def sglang_penalised(x: torch.Tensor, context: list[int], row: int, rules: OutputRules) -> torch.Tensor:
    """SGLang's penalizers as they run: one update per emitted token (frequency added, presence and repetition set),
    then the additive ones summed into zeros and added, then the repetition scaling."""
    frequency, presence, repetition = torch.zeros(V), torch.zeros(V), torch.ones(V)
    for token in context:
        frequency[token] += rules.frequency[row]
        presence[token] = rules.presence[row]
        repetition[token] = rules.repetition[row]
    x = x + (torch.zeros(V) - frequency - presence)
    return torch.where(x < 0, x * repetition, x / repetition)


def rules_for(b: int, gen: torch.Generator, penalties=True, banned=True, bad_words=True, held=True,
              arithmetic="vllm", bias=False) -> OutputRules:
    emitted = [torch.randint(0, 6, (int(torch.randint(0, 5, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(b)]
    rules = OutputRules(V, emitted, arithmetic=arithmetic)
    if penalties:
        rules.prompt = torch.randint(0, V + 1, (b, 7), generator=gen)  # V: padding
        rules.presence = torch.tensor([0.0, 0.7, -0.4, 0.0, 1.5][:b])
        rules.frequency = torch.tensor([0.0, 0.3, 0.0, 0.9, -0.2][:b])
        rules.repetition = torch.tensor([1.0, 1.3, 1.0, 0.8, 2.0][:b])
    if banned:
        rules.banned = torch.zeros(b, V, dtype=torch.bool)
        rules.banned[1, 20:] = True
    if bad_words:
        rules.bad_words = {0: [[3], [1, 2], [2, 2, 4]], 3: [[5, 1]]}
    if bias:
        rules.bias = torch.randn(b, V, generator=gen)
    if held:
        rules.held_back = {2: HeldBack(3, [0, 7]), 4: HeldBack(1, list(range(V)), restore=True),
                           1: HeldBack(2, [21], restore=True)}
    return rules


@pytest.mark.parametrize("parts", [dict(), dict(banned=False, bad_words=False, held=False),
                                   dict(penalties=False), dict(penalties=False, banned=False, bad_words=False),
                                   dict(bias=True), dict(arithmetic="sglang", bias=True),
                                   dict(arithmetic="sglang", banned=False, bad_words=False)])
def test_each_node_sees_its_own_path(parts):
    gen = torch.Generator().manual_seed(3)
    b = 5
    tree = random_trees(b, N, 6, gen)
    logits = torch.randn(b, N, V, generator=gen) * 3
    rules = rules_for(b, gen, **parts)
    got = rules.apply(tree, logits.clone())
    for row in range(b):
        for node in range(N):
            context = node_context(tree, row, node, rules.emitted[row])
            want = one_node(logits[row, node], context, int(tree.depths[row, node]), row, rules)
            assert torch.equal(got[row, node], want), (row, node, context)


def test_rules_change_what_they_should_and_nothing_else():
    gen = torch.Generator().manual_seed(5)
    tree = random_trees(5, N, 6, gen)
    logits = torch.randn(5, N, V, generator=gen)
    got = OutputRules(V, [[] for _ in range(5)]).apply(tree, logits.clone())
    assert torch.equal(got, logits)  # no rules: untouched
    rules = rules_for(5, gen)
    got = rules.apply(tree, logits.clone())
    assert torch.isneginf(got[1, :, 20:]).all()  # banned ids, at every node
    assert torch.isneginf(got[0, :, 3]).all()  # a bad word of one id
    shallow = tree.depths[2] < 3
    assert torch.isneginf(got[2][shallow][:, [0, 7]]).all() and torch.isfinite(got[2][~shallow][:, [0, 7]]).all()
    at_root = got[4, 0]
    assert torch.equal(at_root, one_node(logits[4, 0], rules.emitted[4], 0, 4, rules))  # all held back: restored


def test_a_draft_vocabulary_gets_the_target_ids_columns():
    """Logits over a subset of the ids (a draft's vocabulary, ``columns``) get exactly those ids' columns."""
    gen = torch.Generator().manual_seed(7)
    b, k, d = 5, 4, 3
    paths = torch.randint(-1, 6, (b, k, d), generator=gen)
    paths = torch.where(torch.cumsum(paths < 0, dim=2) > 0, -1, paths)  # padding only at the end
    depths = (paths >= 0).sum(2)
    columns = torch.tensor([0, 3, 5, 7, 21, 22, 30, 2])
    logits = torch.randn(b, k, V, generator=gen)
    rules = rules_for(b, gen, bias=True)
    whole = rules.apply_at(paths, depths, logits.clone())
    part = rules.apply_at(paths, depths, logits[..., columns].clone(), columns)
    assert torch.equal(part, whole[..., columns])


def test_rules_followed_by_the_tokens_a_step_emitted():
    rules = OutputRules(V, [[1], [2, 3]], held_back={0: HeldBack(3, [4]), 1: HeldBack(2, [4])})
    after = rules.followed_by([[5, 6], [7, 8, 9]])
    assert after.emitted == [[1, 5, 6], [2, 3, 7, 8, 9]] and rules.emitted == [[1], [2, 3]]
    assert after.held_back == {0: HeldBack(1, [4])}  # row 1 has reached its minimum


def test_sglang_frequency_is_its_running_float_sum():
    """SGLang adds ``f`` once per occurrence: from 6 or 7 occurrences of 0.3 or 0.1 that sum differs from ``n * f``
    (and over 700, the sums' rounding has drifted far from it)."""
    gen = torch.Generator().manual_seed(11)
    emitted = [[2] * 6, [4] * 700]
    paths = torch.tensor([[[2, 2, -1], [2, 3, 2]], [[4, 4, 4], [4, -1, -1]]])
    depths = (paths >= 0).sum(2)
    rules = OutputRules(V, emitted, prompt=torch.empty(2, 0, dtype=torch.long), presence=torch.zeros(2),
                        frequency=torch.tensor([0.3, 0.1]), repetition=torch.ones(2), arithmetic="sglang")
    logits = torch.randn(2, 2, V, generator=gen)
    got = rules.apply_at(paths, depths, logits.clone())
    multiplied = 0
    for row in range(2):
        for node in range(2):
            context = emitted[row] + [t for t in paths[row, node].tolist() if t >= 0]
            assert torch.equal(got[row, node], sglang_penalised(logits[row, node], context, row, rules))
            token, count = context[0], Counter(context)[context[0]]
            multiplied += bool(got[row, node, token] != logits[row, node, token] - rules.frequency[row] * count)
    assert multiplied > 0
