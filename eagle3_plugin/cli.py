"""``eagle3``: train | bench | check | convert | inspect. Errors in user input print one line and exit with status 2."""

from __future__ import annotations

import argparse
import shlex
import sys

from .errors import Eagle3Error


def _int_triple(text: str) -> tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three comma-separated integers, got {text!r}") from None
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected three comma-separated integers, got {text!r}")
    return values


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train an EAGLE-3 draft for a transformers target (training-time test)")
    p.add_argument("--target", required=True, help="target model folder (transformers)")
    p.add_argument("--data", required=True, nargs="+", help=".txt documents or .jsonl records")
    p.add_argument("--out", required=True, help="output draft folder")
    p.add_argument("--layers", type=_int_triple, help="capture ids low,mid,high (id i = input of decoder layer i)")
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--draft-vocab", type=int, help="draft vocabulary size (default: the target's)")
    p.add_argument("--max-steps", type=int, help="training steps (default 2000; none with --max-minutes alone)")
    p.add_argument("--max-minutes", type=float,
                   help="alone: the schedule spans this many minutes; with --max-steps: stop (resumably) after them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=384)
    p.add_argument("--regenerate", action="store_true", help="answer each prompt with the target itself")
    p.add_argument("--regen-tokens", type=int, default=128)
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.set_defaults(run=_run_train)


def _run_train(a) -> int:
    from .train.loop import TrainArgs, train
    out = train(TrainArgs(target=a.target, data=a.data, out=a.out, layers=a.layers, ttt_steps=a.ttt_steps,
                          draft_vocab=a.draft_vocab, max_steps=a.max_steps, max_minutes=a.max_minutes, seed=a.seed,
                          lr=a.lr, batch_size=a.batch_size, max_length=a.max_length, regenerate=a.regenerate,
                          regen_tokens=a.regen_tokens, force=a.force))
    print(f"draft written to {out}")
    return 0


def _int_list(text: str) -> tuple:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _add_bench(sub) -> None:
    from .bench.engines import ENGINES
    p = sub.add_parser("bench", help="acceptance, speed and latency, with and without speculation, in one run")
    p.add_argument("--engine", choices=ENGINES, default="reference",
                   help="reference | vllm | sglang: started by the bench; openai: a running server at --url")
    p.add_argument("--target", required=True, help="target model folder (its tokenizer; the model for started engines)")
    p.add_argument("--draft", help="draft folder (required unless --engine openai)")
    p.add_argument("--prompts", required=True,
                   help="question.jsonl (turns: later turns follow the engine's own answers), HumanEval/GSM8K "
                        "jsonl, or .txt")
    p.add_argument("--max-prompts", type=int)
    p.add_argument("--max-turns", type=int, help="ask at most this many turns of each conversation (default all)")
    p.add_argument("--chat-template", choices=("auto", "none"), default="auto",
                   help="auto: the target tokenizer's chat template when it has one, else plain text; none: plain")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=1, metavar="S",
                   help="generations per prompt, each seeded differently (T>0: the report's acceptance carries a "
                        "95%% confidence interval)")
    p.add_argument("--concurrency", type=_int_list, default=(1,), metavar="N[,N...]",
                   help="requests in flight; a list (1,4,16) sweeps them into one report")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--chain", type=int, metavar="K", help="a chain of K draft tokens")
    shape.add_argument("--tree", type=_int_triple, metavar="DEPTH,TOPK,TOTAL",
                       help="dynamic tree: DEPTH draft levels, TOPK children, TOTAL tokens verified incl. root")
    p.add_argument("--tree-sampler", choices=("real", "one_hot"))
    p.add_argument("--budget", choices=("fixed", "auto"), default="fixed",
                   help="fixed: always the tree above (default, what a regression check compares); auto: per step, "
                        "the shape the load pays for")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine-args", type=shlex.split, default=(), metavar="'ARGS'",
                   help="extra engine arguments: vllm serve's for --engine vllm (e.g. '--max-model-len 512'), the "
                        "server's for --engine sglang (e.g. '--device cpu --dtype float32')")
    p.add_argument("--url", help="--engine openai: the server to measure (e.g. http://127.0.0.1:8000)")
    p.add_argument("--baseline-url", help="--engine openai: a server without speculation, for the speed ratio")
    p.add_argument("--json", dest="json_out", metavar="OUT")
    p.add_argument("--plot", dest="plot_out", metavar="OUT.png")
    p.set_defaults(run=_run_bench)


def _run_bench(a) -> int:
    from .bench.run import BenchArgs, bench
    bench(BenchArgs(**{k: v for k, v in vars(a).items() if k not in ("run", "command")}))
    return 0


def _add_check(sub) -> None:
    p = sub.add_parser("check", help="fail when a bench report's acceptance fell below a baseline")
    p.add_argument("report")
    p.add_argument("--baseline", required=True)
    p.add_argument("--rtol", type=float, default=0.05,
                   help="greedy: fail below baseline x (1 - rtol); 0: exact, any change fails")
    p.add_argument("--alpha", type=float, default=0.01,
                   help="T>0: fail only on a drop significant at this level (one-sided z-test of the mean "
                        "acceptance length, from both reports' standard errors)")
    p.set_defaults(run=_run_check)


def _run_check(a) -> int:
    from .bench.check import compare, load_report
    ok, table = compare(load_report(a.report), load_report(a.baseline), a.rtol, a.alpha)
    print(table)
    return 0 if ok else 1


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help="convert a draft between EAGLE-3 checkpoint formats")
    p.add_argument("src")
    p.add_argument("--to", required=True, choices=("eagle", "specforge", "speculators", "vllm", "sglang", "ours"))
    p.add_argument("--out", required=True)
    p.add_argument("--target", help="validate against this target (and take its default capture ids if needed)")
    p.add_argument("--layers", type=_int_triple, help="capture ids low,mid,high in our rule (input of layer i)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--shard-size", type=float, metavar="MB", help="write shards of at most MB megabytes + an index")
    p.set_defaults(run=_run_convert)


def _run_convert(a) -> int:
    from .convert import convert
    shard_bytes = int(a.shard_size * 1e6) if a.shard_size else None
    fmt = convert(a.src, a.to, a.out, target=a.target, layers=a.layers, force=a.force, shard_bytes=shard_bytes)
    print(f"converted {a.src} ({fmt}) -> {a.out} ({a.to})")
    if fmt == "specforge" and a.layers is None:
        print("eagle3 convert: warning: this layout's eagle_config.eagle_aux_hidden_state_layer_ids means one layer "
              "lower to SGLang/SpecForge (read so here) than to vLLM (as written); if the draft was trained for vLLM's "
              "reading, re-convert with --layers, and check with: eagle3 inspect OUT --target T --prompts P --probe",
              file=sys.stderr)
    return 0


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="format, shapes, vocabulary mapping, capture layers and problems of a draft")
    p.add_argument("folder")
    p.add_argument("--target")
    p.add_argument("--layers", type=_int_triple)
    p.add_argument("--json", action="store_true")
    p.add_argument("--probe", action="store_true",
                   help="run the draft under each candidate reading of its capture ids (needs --target, --prompts)")
    p.add_argument("--prompts", help="prompts for --probe")
    p.add_argument("--max-prompts", type=int, default=8)
    p.set_defaults(run=_run_inspect)


def _run_inspect(a) -> int:
    import json

    from .convert import format_report, inspect_report
    report = inspect_report(a.folder, a.target, a.layers)
    readings = None
    if a.probe and not report["problems"]:
        if not (a.target and a.prompts):
            raise Eagle3Error("--probe needs --target and --prompts")
        from .probe import format_readings, probe
        readings = probe(a.folder, a.target, a.prompts, a.max_prompts)
        report["probe"] = [{"reading": r.name, "layer_ids": list(r.layer_ids),
                            "mean_acceptance_length": r.mean_acceptance_length} for r in readings]
    print(json.dumps(report, indent=2) if a.json else format_report(report))
    if readings and not a.json:
        print(format_readings(readings))
    return 1 if report["problems"] else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_bench(sub)
    _add_check(sub)
    _add_convert(sub)
    _add_inspect(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except Eagle3Error as e:
        print(f"eagle3 {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
