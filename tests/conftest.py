import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle3_plugin.draft import DraftConfig, Eagle3Draft


def pytest_configure(config):
    """Under pytest-xdist (``ci/test.sh`` runs one worker per core), each worker and everything it starts (vLLM
    engines, SGLang servers, reference runs) stays on a core of its own: vLLM binds an engine's compute to the last
    core unless told otherwise, and two engines on one core would run at half speed each."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...
    if worker is None:
        return
    cores = sorted(os.sched_getaffinity(0))
    core = cores[int(worker[2:]) % len(cores)]
    os.sched_setaffinity(0, {core})
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def tiny_llama(num_layers: int = 6, vocab: int = 97, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper distributions than the default init, so argmax is well defined
        model.lm_head.weight.mul_(20)
    return model


def random_draft(target, draft_vocab: int = 61, seed: int = 1) -> Eagle3Draft:
    torch.manual_seed(seed)
    draft = Eagle3Draft(DraftConfig.for_target(target.config, draft_vocab)).eval()
    hot = torch.sort(torch.randperm(target.config.vocab_size)[:draft_vocab]).values
    draft.d2t.copy_(hot - torch.arange(draft_vocab))
    draft.t2d.zero_()[hot] = True
    return draft


@pytest.fixture(scope="module")
def target():
    return tiny_llama()


@pytest.fixture(scope="module")
def draft(target):
    return random_draft(target)


@pytest.fixture(scope="session")
def glm4(tmp_path_factory):
    """A tiny Glm4 target (no EAGLE-3 capture in vLLM or SGLang) and a draft trained for it: (target, draft)."""
    from glm4_target import build_glm4_target, train_draft_for
    work = tmp_path_factory.mktemp("glm4")
    target = build_glm4_target(str(work / "target"))
    return target, train_draft_for(target, str(work / "draft"), str(work))
