"""The T > 0 cases every engine's losslessness test runs, and their exact laws.

A request's first generated token comes from the prefill; with a depth-3 tree the next three are the ones the first
round of speculation decides, level by level. The joint law of those four tokens is enumerated from the target
(``stats_util.path_law``, built on the numpy reference ``target_law``) and compared by chi-square (alpha :data:`ALPHA`;
the four-token paths and, zeros included, the first token alone) with an engine's generations: at T = 1 alone, and in
one batch that mixes greedy rows, T = 1 rows and rows with top-k and top-p together, each row group against its own
law. The law is the engine's own: SGLang filters top-k and top-p jointly (``joint=True``, as its sampler draws the
prefill's token), vLLM one after the other.

The engines draw from unseeded generators, so these tests can fail on chance alone: nine such p-values a suite
(vLLM's two workers, SGLang's server). At alpha 1e-3 that is about one suite in a hundred, and it happened (stop 34:
SGLang's mixed batch at p = 6e-4, then 24,000 rows per group from the same server at p 0.03-0.99). So the engines are
held to ``ALPHA = 1e-4``, one suite in a thousand; near alpha the p-values are Monte Carlo tails under the exact
law (``stats_util.chi_square_pvalue``), and a wrong sampler (stock SGLang on CPU) scores below 1e-6.
"""

from transformers import AutoTokenizer

from bundled import HELDOUT, TARGET
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from stats_util import path_law

ALPHA = 1e-4  # the engines' unseeded law tests (see above)
LENGTH = 4  # the prefill's token, then one per tree level
N = 3000  # rows of the T = 1 test
MIXED = 2000  # rows per group of the mixed batch

# row group -> (held-out prompt, sampling settings); the prompts are ones whose four-token law has many paths above
# the chi-square's pooling threshold under these settings (on others it is too flat to test, or one path)
GROUPS = {"greedy": (34, dict(temperature=0.0)),
          "T=1": (6, dict(temperature=1.0)),
          "T=0.8,top_k,top_p": (3, dict(temperature=0.8, top_k=20, top_p=0.9))}


def group_prompts() -> dict:
    tok = AutoTokenizer.from_pretrained(TARGET)
    return {group: encode_prompt(tok, read_prompts(HELDOUT)[index].prompt) for group, (index, _) in GROUPS.items()}


def mixed_order() -> list:
    """The mixed batch's row groups, interleaved so that every engine step mixes all three."""
    return [group for _ in range(MIXED) for group in GROUPS]


def group_pvalue(prompts: dict, group: str, generations: list, joint: bool = False) -> float:
    """Chi-square p-value of one group's generations (token id lists) against its exact four-token law."""
    return path_law(TARGET, prompts[group], LENGTH, **GROUPS[group][1], joint=joint).pvalue(generations)


def mixed_pvalues(prompts: dict, order: list, generations: list, joint: bool = False) -> dict:
    return {group: group_pvalue(prompts, group, [gen for gen, g in zip(generations, order) if g == group], joint)
            for group in GROUPS}
