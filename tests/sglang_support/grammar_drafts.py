"""Run on SGLang's interpreter: drafts under SGLang's own grammars (its xgrammar backend over the bundled tokenizer,
as the server builds them) obey each grammar at every node of the tree, which SGLang verifies whole, and leave the
grammars where they stood; without them the same draft leaves the grammars. At the next step, the verify masks our
shim builds over those trees (reusing what the draft read, or not) equal SGLang's own ``generate_token_bitmask``, also
over the unmasked draft's trees. Prints "obeyed"."""
import json
import os
import types

import torch
from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
from sglang.srt.speculative.spec_utils import generate_token_bitmask
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3_plugin.checkpoint import load_draft
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.output_rules import drafting_rules
from eagle3_plugin.rng import RowRandom
from eagle3_plugin.sampler import SamplingParams
from eagle3_plugin.sglang.grammars import draft_grammars, tree_bitmask
from eagle3_plugin.sglang.verify import _links
from eagle3_plugin.speculator import DraftKV, DraftRows, Speculator, TreeShape

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET, DRAFT = os.path.join(ROOT, "checkpoints", "target"), os.path.join(ROOT, "checkpoints", "draft")
SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                     "required": ["name", "age"]})
SHAPE = TreeShape(5, 8, 32)
# per row: a grammar (None: a free row), and the text its output so far and this step's tokens spell
ROWS = [(("json", SCHEMA), '{"name": "Al", "'), (None, "the cat"),
        (("regex", "(yes|no), because [a-z ]+\\."), "no, bec"),
        (("ebnf", 'root ::= ("yes" | "no") ", since " [a-z]+ (" " [a-z]+)* "."'), "yes, since the")]

tokenizer = AutoTokenizer.from_pretrained(TARGET)
target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32)
draft = load_draft(DRAFT, dtype=torch.float32).eval()
draft.attach_embedding(target.get_input_embeddings())
vocab = draft.config.vocab_size
backend = XGrammarGrammarBackend(tokenizer, vocab_size=vocab)
texts = [tokenizer.encode(text, add_special_tokens=False) for _, text in ROWS]
output, emitted = [ids[:-2] for ids in texts], [ids[-2:] for ids in texts]


def grammar(row, tokens):
    """Row ``row``'s grammar, fresh, after ``tokens`` (None if it refuses one)."""
    kind, spec = ROWS[row][0]
    g = getattr(backend, f"dispatch_{kind}")(spec)
    for token in tokens:
        if g.is_terminated() or not g.matcher.accept_token(token):
            return None
    return g


def allowed(g) -> torch.Tensor:
    mask = g.allocate_vocab_mask(vocab_size=vocab, batch_size=1, device="cpu")
    g.fill_vocab_mask(mask, 0)
    return ((mask[0, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:vocab].bool()


def draft_trees(reqs, masked: bool):
    b, n = len(ROWS), 12
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(3, vocab, (b, n), generator=g)
    tokens[:, -1] = torch.tensor([e[-1] for e in emitted])  # the roots: each row's last emitted token
    rows = DraftRows(torch.arange(b * 64).view(b, 64), torch.zeros(b, dtype=torch.long), torch.full((b,), n), tokens,
                     torch.randn(b, n, 3 * draft.config.target_hidden_size, generator=g))
    kv = DraftKV.allocate(b * 64, draft.config.num_key_value_heads, draft.config.head_dim, torch.float32)
    speculator = Speculator(draft, Eagle3Config(depth=5, top_k=8, total_tokens=32))
    with torch.inference_mode(), draft_grammars(reqs, emitted, vocab) as grammars:
        rules = drafting_rules(None, grammars if masked else None, vocab, emitted)
        tree = speculator.step(kv, rows, SamplingParams.uniform(b), RowRandom(torch.Generator(), {}), SHAPE, rules)
    return tree, {reqs[row].rid: kept for row, kept in grammars.kept.items()}


def broken_nodes(tree, row) -> tuple[int, int]:
    """How many of the row's nodes leave its grammar, among those that could obey it (its parent's path obeys it,
    and a node whose parent's path allows fewer ids than ``top_k`` grows masked children past them); and how many
    could."""
    parents, tokens = tree.parents[row].tolist(), tree.tokens[row].tolist()
    broken = checked = 0
    for node in range(1, len(tokens)):
        path, at = [], node
        while at > 0:
            path.insert(0, tokens[at])
            at = parents[at]
        g = grammar(row, output[row] + emitted[row] + path[:-1])
        rank = sum(parents[other] == parents[node] for other in range(1, node))
        if g is not None and not g.is_terminated() and rank < int(allowed(g).sum()):
            checked += 1
            broken += not bool(allowed(g)[path[-1]])
    return broken, checked


reqs = [types.SimpleNamespace(rid=f"r{row}", grammar=None if spec is None else grammar(row, output[row]))
        for row, (spec, _) in enumerate(ROWS)]
before = [None if r.grammar is None else allowed(r.grammar) for r in reqs]
(masked, kept), (unmasked, _) = draft_trees(reqs, True), draft_trees(reqs, False)
after = [None if r.grammar is None else allowed(r.grammar) for r in reqs]
assert all(a is None or torch.equal(a, b) for a, b in zip(after, before)), "the grammars were left advanced"
for row, (spec, _) in enumerate(ROWS):
    if spec is None:
        continue
    broken, checked = broken_nodes(masked, row)
    assert checked >= 10 and broken == 0, (row, broken, checked)
    assert broken_nodes(unmasked, row)[0] > 0, row  # the test means something: the free draft leaves the grammar
for r, e in zip(reqs, emitted):  # the next step: SGLang has advanced each grammar by the step's tokens
    if r.grammar is not None:
        for token in e:
            r.grammar.accept_token(token)
assert kept and all(len(paths) >= 20 for paths in kept.values()), {rid: len(p) for rid, p in kept.items()}
for tree, reused in ((masked, kept), (masked, {}), (unmasked, {})):
    links = _links(tree)
    theirs, _ = generate_token_bitmask(reqs, *links, tree.tokens, vocab)
    ours, _ = tree_bitmask(reqs, *links, tree.tokens, vocab, reused)
    assert torch.equal(ours, theirs), (ours != theirs).any(1).nonzero()[:, 0].tolist()
print("obeyed")
