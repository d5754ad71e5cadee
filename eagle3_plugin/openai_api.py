"""A small client for OpenAI-compatible servers (vLLM, SGLang), standard library only: streaming completions with
their timings, the served model's name, and vLLM's speculative-decoding counters from ``/metrics``."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Optional

SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@dataclass
class Completion:
    """One streamed completion. ``token_ids`` when the server returns them (vLLM's ``return_token_ids``);
    times are ``time.perf_counter()`` values: request sent, first generated text received, stream ended."""

    text: str
    tokens: int
    token_ids: Optional[list]
    started: float
    first_token: Optional[float]
    finished: float

    @property
    def seconds(self) -> float:
        return self.finished - self.started


def served_model(url: str, timeout: float = 10) -> str:
    """The first model id the server lists at ``/v1/models``."""
    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout) as r:
        return json.loads(r.read())["data"][0]["id"]


def stream_completion(url: str, model: str, prompt, max_tokens: int, temperature: float = 0.0,
                      seed: Optional[int] = None, ignore_eos: bool = True, timeout: float = 300.0) -> Completion:
    """One streaming ``/v1/completions`` request (``prompt``: text or token ids)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "ignore_eos": ignore_eos, "return_token_ids": True, "stream_options": {"include_usage": True}}
    if seed is not None:
        body["seed"] = seed
    request = urllib.request.Request(url.rstrip("/") + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"HTTP {e.code}: {e.read()[:500]!r}") from None
    text, token_ids, tokens, first_token = [], [], 0, None
    with response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            for choice in event.get("choices", []):
                if first_token is None and choice.get("text"):
                    first_token = time.perf_counter()
                text.append(choice.get("text") or "")
                if choice.get("token_ids") is not None and token_ids is not None:
                    token_ids.extend(choice["token_ids"])
                elif choice.get("text"):
                    token_ids = None  # a server that does not return ids: compare text instead
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return Completion("".join(text), tokens, token_ids, started, first_token, time.perf_counter())


@dataclass
class SpecCounters:
    """vLLM's cumulative ``vllm:spec_decode_*_total`` counters; ``per_position[i]``: drafts accepted at depth i+1."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    per_position: list

    def minus(self, earlier: "SpecCounters") -> "SpecCounters":
        per_position = [a - b for a, b in zip(self.per_position, earlier.per_position + [0.0] * len(self.per_position))]
        return SpecCounters(self.num_drafts - earlier.num_drafts, self.num_draft_tokens - earlier.num_draft_tokens,
                            self.num_accepted_tokens - earlier.num_accepted_tokens, per_position)


def spec_counters(url: str, timeout: float = 10) -> Optional[SpecCounters]:
    """The server's speculative-decoding counters, or None when it exposes none (no speculation, or not vLLM)."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as r:
        metrics = r.read().decode()
    values = {}
    for name in SPEC_COUNTERS:
        match = re.search(rf"^vllm:spec_decode_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", metrics, re.M)
        if match is None:
            return None
        values[name] = float(match.group(1))
    positions = re.findall(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} '
                           r'([0-9.e+]+)$', metrics, re.M)
    per_position = [0.0] * (max((int(p) for p, _ in positions), default=-1) + 1)
    for p, v in positions:
        per_position[int(p)] = float(v)
    return SpecCounters(**values, per_position=per_position)
