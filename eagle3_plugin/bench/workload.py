"""What a benchmark sends: conversations (one or more user turns), each generated ``samples`` times, and how each
turn becomes token ids for the target (its chat template, or plain text).

A later turn is asked after the engine has answered the earlier ones: its prompt holds the earlier turns and the
engine's own answers (MT-Bench's second turns), so a conversation's requests run one after another while other
conversations are in flight."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..datafiles import encode_conversation
from ..errors import Eagle3Error


@dataclass(frozen=True)
class Job:
    """One generation of one conversation: ``seed`` for its sampling (turn t uses ``seed + t``)."""

    conversation: int
    sample: int
    category: Optional[str]
    turns: tuple
    seed: int


@dataclass
class Generation:
    """One request's result. Times are ``time.perf_counter()`` values; ``first_token`` None when the engine does
    not stream; ``stats`` None without speculation or when the engine reports acceptance only in aggregate."""

    tokens: Optional[list]
    text: str
    started: float
    first_token: Optional[float]
    finished: float
    stats: object = None
    num_tokens: int = 0

    def __post_init__(self):
        if self.tokens is not None:
            self.num_tokens = len(self.tokens)

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def tpot(self) -> Optional[float]:
        """Seconds per output token after the first (vLLM's and SGLang's definition)."""
        if self.first_token is None or self.num_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.num_tokens - 1)


@dataclass
class Record:
    """A finished request: which job and turn, and its generation."""

    job: Job
    turn: int
    generation: Generation

    @property
    def key(self) -> tuple:
        return self.job.conversation, self.job.sample, self.turn


class Workload:
    """Builds each turn's prompt ids. ``chat_template``: ``auto`` uses the target tokenizer's template when it has
    one (plain text otherwise), ``none`` always plain text: the turns and answers joined by blank lines, with BOS."""

    def __init__(self, tokenizer, chat_template: str = "auto"):
        if chat_template not in ("auto", "none"):
            raise Eagle3Error(f"--chat-template must be auto or none, got {chat_template!r}")
        self.tokenizer = tokenizer
        self.use_template = chat_template == "auto" and bool(getattr(tokenizer, "chat_template", None))

    @property
    def template_name(self) -> str:
        return "target" if self.use_template else "plain"

    def prompt_ids(self, turns: tuple, answers: list) -> list:
        """Token ids asking turn ``len(answers)`` after the earlier turns and their answers."""
        return encode_conversation(self.tokenizer, turns[: len(answers) + 1], answers, self.use_template)

    def text(self, tokens: list) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


@dataclass
class Conversation:
    """A job in progress: the answers so far and the finished records."""

    job: Job
    workload: Workload
    answers: list = field(default_factory=list)
    records: list = field(default_factory=list)

    @property
    def turn(self) -> int:
        return len(self.answers)

    @property
    def done(self) -> bool:
        return self.turn == len(self.job.turns)

    @property
    def seed(self) -> int:
        return self.job.seed + self.turn

    def next_prompt(self) -> list:
        return self.workload.prompt_ids(self.job.turns, self.answers)

    def finish_turn(self, generation: Generation) -> None:
        text = generation.text if generation.tokens is None else self.workload.text(generation.tokens)
        self.records.append(Record(self.job, self.turn, generation))
        self.answers.append(text)


def jobs_for(records, samples: int, seed: int, max_turns: Optional[int]) -> list:
    """Every conversation ``samples`` times; sample s of conversation i is seeded ``seed + 1000 * (i * samples + s)``
    (room for the turns' offsets)."""
    if samples < 1:
        raise Eagle3Error(f"--samples must be >= 1, got {samples}")
    return [Job(i, s, r.category, tuple(r.turns[:max_turns]), seed + 1000 * (i * samples + s))
            for i, r in enumerate(records) for s in range(samples)]
