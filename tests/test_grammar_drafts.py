"""The core's reading of an engine's grammar matchers for drafting (``eagle3_plugin.grammar_drafts``), with xgrammar's
own matchers over the bundled tokenizer (xgrammar, the backend both engines use by default, comes with vLLM)."""

import pytest
import torch
import xgrammar
from transformers import AutoModelForCausalLM, AutoTokenizer

from bundled import TARGET
from eagle3_plugin.grammar_drafts import DraftGrammars


def test_draft_grammars_mask_the_paths_and_leave_the_matchers_as_found():
    """An engine's xgrammar matchers as the core reads them: inside, each stands after its row's emitted tokens and
    answers what its grammar allows after a draft path; after the block, an error in it too, it is where it was."""
    tok = AutoTokenizer.from_pretrained(TARGET)
    v = AutoModelForCausalLM.from_pretrained(TARGET).config.vocab_size
    compiled = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=v)).compile_regex(
        "(yes|no), because [a-z ]+\\.")
    matchers = {0: xgrammar.GrammarMatcher(compiled), 2: xgrammar.GrammarMatcher(compiled)}

    def state(matcher):
        mask = xgrammar.allocate_token_bitmask(1, v)
        matcher.fill_next_token_bitmask(mask, 0)
        return mask
    before = {row: state(m) for row, m in matchers.items()}
    emitted = [tok.encode("yes", add_special_tokens=False), [], tok.encode("no", add_special_tokens=False)]
    comma = tok.encode(",", add_special_tokens=False)
    with pytest.raises(RuntimeError):
        with DraftGrammars(matchers, emitted, v, whole_tree=False) as grammars:
            assert grammars.rows == [0, 2]
            allowed = grammars.allowed_after([0, 2], [comma, [5]])  # row 2's path leaves its grammar: all allowed
            assert 0 < allowed[0].sum() < v and not allowed[0, comma[-1]]  # after "yes,": " because", no comma
            assert bool(allowed[1].all())
            raise RuntimeError("drafting failed")
    assert all(torch.equal(state(m), before[row]) for row, m in matchers.items())
    with DraftGrammars(matchers, [[5], [], [5]], v, whole_tree=True) as grammars:  # tokens outside both grammars
        assert grammars is None
    assert all(torch.equal(state(m), before[row]) for row, m in matchers.items())


def test_paths_asked_together_get_what_each_gets_alone():
    """Many paths of one row at once (shared prefixes, any order, some leaving the grammar, some ending it) get the
    masks each path gets from a fresh matcher, at the ids asked for, and the matcher is left where it was."""
    tok = AutoTokenizer.from_pretrained(TARGET)
    v = AutoModelForCausalLM.from_pretrained(TARGET).config.vocab_size
    compiled = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=v)).compile_regex(
        "(yes|no), because [a-z ]+\\.")
    ids = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    texts = [", because the", ", because", ", bec", ",", "", ", because the cat.", "xyz", ", because the dog"]
    paths = [ids(t) for t in texts] + [ids(", because") + [5], ids(", because the cat.") + ids(" more")]
    columns = torch.arange(0, v, 3)

    def alone(path):
        matcher = xgrammar.GrammarMatcher(compiled)
        mask = torch.full((1, (v + 31) // 32), -1, dtype=torch.int32)
        taken = all(matcher.accept_token(t) for t in ids("yes") + path)
        if taken and not matcher.is_terminated():
            matcher.fill_next_token_bitmask(mask, 0)
        return ((mask[0, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:v].bool()

    matcher = xgrammar.GrammarMatcher(compiled)
    with DraftGrammars({0: matcher}, [ids("yes")], v, whole_tree=True) as grammars:
        together = grammars.allowed_after([0] * len(paths), paths, columns)
        assert together.shape == (len(paths), len(columns))
        for path, got in zip(paths, together):
            assert torch.equal(got, alone(path)[columns]), tok.decode(path)
        assert torch.equal(grammars.allowed_after([0], [[]])[0], alone([]))  # where the step left it
    assert torch.equal(grammars.allowed_after([0], [ids("yes")])[0], alone([]))  # rolled back to the start
