"""The `art-langgraph` command line.

    art-langgraph serve --base-model tiny [--host 127.0.0.1] [--port 8000] [--api-key K]
    art-langgraph backend [--path .art] [--host 127.0.0.1] [--port 8090] [--api-key K]
                          [--trainer-ranks W]
    art-langgraph report MODEL_DIR [--out FILE]
    art-langgraph promote NAME|MODEL_DIR STEP [--path .art] [--project P]
    art-langgraph rollback NAME|MODEL_DIR [--path .art] [--project P]
    art-langgraph langfuse export MODEL_DIR|FILE [--step N] [--all]
    art-langgraph langfuse import-scores MODEL_DIR|FILE [--name N] [--source S] [--queue Q]
                                         [--out FILE] [--approved-sft FILE]
                                         [--corrections-sft FILE]
    art-langgraph langfuse review MODEL_DIR --queue NAME [--fraction F] [--split S] [--step N]
    art-langgraph langfuse calibrate MODEL_DIR --queue NAME [--dataset-run ID]

`serve` starts the OpenAI-compatible server on the torch engine. `backend` starts the
backend server for `RemoteBackend(url)`: engine, trainer and checkpoints under `--path`,
the training API on `/art/v1` and the OpenAI endpoint on `/v1` of the same port. The API
key may also come from `$ART_API_KEY`. `report` writes one self-contained HTML page to
review a model folder's steps and trajectories. `langfuse export` sends a model folder's
trajectories to Langfuse (those not sent yet; keys from `LANGFUSE_*`), and
`langfuse import-scores` applies review scores given in Langfuse as rewards (and writes
reviewers' corrected outputs as SFT examples). `langfuse review` sends a sample of saved
rollouts to an annotation queue, `langfuse calibrate` compares its reviews with the RULER
judge (integrations/langfuse/: annotation.py, review.py).
`promote` makes a model's bare name serve STEP, and `rollback` the step promoted before
the current one (for a model with `ModelConfig(promote_on_evaluation=True)`): they write
the model folder's `promotion.jsonl`, which a running server re-reads at its next request.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from art_langgraph.errors import UsageError
from art_langgraph.runtime.allocator import reexec_with_tcmalloc


def _bind_args(p: argparse.ArgumentParser, port: int, guards: str) -> None:
    """--host, --port, --api-key and --log-level, as both servers take them."""
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; others need --api-key)",
    )
    p.add_argument(
        "--port", type=int, default=port, help=f"port to bind (default {port}; 0 picks a free one)"
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("ART_API_KEY"),
        help=f"require 'Authorization: Bearer KEY' on {guards} (default: $ART_API_KEY)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="art-langgraph", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _backend_parser(sub)
    _folder_parsers(sub)
    _langfuse_parser(sub)
    return p


def _serve_parser(sub: Any) -> None:
    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    s.add_argument(
        "--base-model",
        default="tiny",
        help="a preset ('tiny', 'smollm2-135m'), a HF id, a local folder or a .gguf file "
        "(default: tiny)",
    )
    s.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template file replacing the tokenizer's own (as vLLM's)",
    )
    _bind_args(s, 8000, "/v1")
    s.add_argument(
        "--served-name", default=None, help="the model name clients use (default: the base model)"
    )


def _backend_parser(sub: Any) -> None:
    b = sub.add_parser("backend", help="serve the training API for RemoteBackend (and /v1)")
    b.add_argument("--path", default=".art", help="where models live on disk (default .art)")
    _bind_args(b, 8090, "/v1 and /art")
    b.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "torch", "vllm"],
        help="inference engine: torch (ours), vllm (scripts/setup-vllm.sh), auto (vLLM with a GPU)",
    )
    b.add_argument(
        "--engine-dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="the inference engine's dtype (default: the engine's choice for the device)",
    )
    b.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="inference replicas, each a process of its own behind the one /v1 (default 1)",
    )
    b.add_argument(
        "--trainer-ranks",
        type=int,
        default=1,
        help="data-parallel trainer ranks, each a process of its own (default 1: in-process)",
    )
    b.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="place the replicas and trainer ranks as Ray actors on the cluster at ADDRESS "
        "('auto': this machine's cluster; 'local': a Ray instance in this process; "
        "needs the ray extra); default: local processes",
    )
    b.add_argument(
        "--trainer-fsdp",
        default="auto",
        choices=["auto", "on", "off"],
        help="shard the base model over the trainer ranks with FSDP (auto: when it takes more "
        "than 40%% of a rank's GPU; never on CPUs)",
    )


def _folder_parsers(sub: Any) -> None:
    """The commands over a model's folder: its review page, promotion and rollback."""
    r = sub.add_parser("report", help="write a self-contained HTML review page of a model folder")
    r.add_argument("folder", help="a model's folder ({path}/{project}/models/{name})")
    r.add_argument("--out", default=None, help="where to write it (default FOLDER/review.html)")
    for command, what in (
        ("promote", "serve STEP as the model's bare name (promotion gated on evaluation)"),
        ("rollback", "serve again the step promoted before the current one"),
    ):
        pr = sub.add_parser(command, help=what)
        pr.add_argument("model", help="a model's name (under --path) or its folder")
        if command == "promote":
            pr.add_argument("step", type=int, help="the checkpoint step to serve")
        pr.add_argument("--path", default=".art", help="where models live (default .art)")
        pr.add_argument(
            "--project", default=None, help="the model's project (default: the one holding it)"
        )


def _langfuse_parser(sub: Any) -> None:
    lf = sub.add_parser("langfuse", help="send trajectories to Langfuse, read review scores back")
    lsub = lf.add_subparsers(dest="langfuse_command", required=True)
    e = lsub.add_parser("export", help="send a model folder's trajectories (keys: LANGFUSE_*)")
    e.add_argument("folder", help="a model's folder, or one trajectories/{split}/{step}.jsonl")
    e.add_argument("--step", type=int, default=None, help="only this step (every split)")
    e.add_argument("--all", action="store_true", help="re-send batches already sent too")
    i = lsub.add_parser("import-scores", help="apply review scores as rewards")
    i.add_argument("source", help="a model's folder or a trajectories JSONL file")
    i.add_argument("--name", default=None, help="score name to read (default: any)")
    i.add_argument(
        "--source",
        dest="score_source",
        default="ANNOTATION",
        choices=["ANNOTATION", "API", "EVAL", "any"],
        help="score source (default ANNOTATION: given by hand in the UI)",
    )
    i.add_argument(
        "--queue", default=None, help="only scores given in this annotation queue (name or id)"
    )
    i.add_argument("--step", type=int, default=None, help="only this step's trajectories")
    i.add_argument(
        "--value-map",
        default=None,
        help='JSON mapping categorical values to rewards, e.g. \'{"good": 1, "bad": 0}\'',
    )
    i.add_argument(
        "--keep-unscored", action="store_true", help="keep unscored trajectories of reviewed groups"
    )
    i.add_argument(
        "--include-in-progress",
        action="store_true",
        help="with --queue: also take scores of items not marked completed yet",
    )
    i.add_argument("--out", default=None, help="write the reviewed groups here (JSONL)")
    i.add_argument(
        "--approved-sft", default=None, help="write trajectories with reward >= --min-reward here"
    )
    i.add_argument("--min-reward", type=float, default=1.0, help="approval threshold (default 1.0)")
    i.add_argument(
        "--corrections-sft", default=None, help="write reviewers' corrected outputs here (SFT)"
    )
    rv = lsub.add_parser("review", help="send a sample of saved rollouts to an annotation queue")
    rv.add_argument("folder", help="a model's folder")
    rv.add_argument("--queue", required=True, help="the queue's name (made if missing)")
    rv.add_argument("--fraction", type=float, default=0.1, help="seeded share (default 0.1)")
    rv.add_argument("--disagreements", type=int, default=2, help="judge-vs-reward picks a step")
    rv.add_argument("--near-median", type=int, default=2, help="borderline picks a step")
    rv.add_argument("--seed", type=int, default=0, help="seed of the fraction (default 0)")
    rv.add_argument("--split", default="train", help="which split's steps (default train)")
    rv.add_argument("--step", type=int, default=None, help="only this step (default: all)")
    ca = lsub.add_parser("calibrate", help="agreement of the RULER judge with a queue's reviews")
    ca.add_argument("folder", help="a model's folder")
    ca.add_argument("--queue", required=True, help="the queue's name or id")
    ca.add_argument("--dataset-run", default=None, help="also score this dataset run (its id)")


def _langfuse(args: argparse.Namespace) -> int:
    import json

    from art_langgraph.integrations import langfuse as lf

    if args.langfuse_command == "export":
        rep = lf.export_folder(args.folder, step=args.step, resend=args.all)
        print(
            f"sent {rep.batches} batches, {rep.trajectories} trajectories "
            f"({rep.spans} observations, {rep.scores} scores)"
        )
        if rep.review_items or rep.review_unsent:
            print(f"{rep.review_items} rollouts re-sent to review ({rep.review_unsent} not yet)")
        if rep.evaluations:
            print(f"{rep.evaluations} held-out evaluations sent as dataset runs")
        if rep.run_scores or rep.run_scores_unsent:
            print(f"{rep.run_scores} dataset-run scores re-sent ({rep.run_scores_unsent} not yet)")
        if rep.failed_batches or rep.failed_evaluations:
            print(f"not sent: {[*rep.failed_batches, *rep.failed_evaluations]}", file=sys.stderr)
            return 1
        return 1 if rep.review_unsent or rep.run_scores_unsent else 0
    if args.langfuse_command in ("review", "calibrate"):
        return _review(args)
    queue_id = None
    if args.queue:
        from art_langgraph.integrations.langfuse.annotation import queue_id_for

        queue_id = queue_id_for(args.queue)
    res = lf.import_scores(
        args.source,
        name=args.name,
        source=None if args.score_source == "any" else args.score_source,
        queue_id=queue_id,
        step=args.step,
        value_map=json.loads(args.value_map) if args.value_map else None,
        partial="keep" if args.keep_unscored else "drop",
        out=args.out,
        completed_only=not args.include_in_progress,
    )
    print(
        f"{res.applied} trajectories rescored in {len(res.groups)} groups ({res.dropped} unscored dropped)"
    )
    if res.in_progress:
        print(
            f"{res.in_progress} queue scores left out: their items are not marked completed "
            "(--include-in-progress takes them)"
        )
    if res.unmatched:
        print(f"{len(res.unmatched)} scores name traces not in {args.source}:")
        for s in res.unmatched[:20]:
            print(f"  {s.id} trace {s.trace_id} {s.name}={s.value!r}")
    if res.unusable:
        print(f"{len(res.unusable)} scores are not numbers (pass --value-map): ")
        for s in res.unusable[:20]:
            print(f"  {s.id} trace {s.trace_id} {s.name}={s.value!r}")
    if args.approved_sft:
        n = lf.approved_sft_file(res, args.approved_sft, min_reward=args.min_reward)
        print(f"{n} approved trajectories -> {args.approved_sft}")
    if args.corrections_sft:
        from art_langgraph.integrations.langfuse.sft import corrections_sft_file

        n = corrections_sft_file(args.source, args.corrections_sft, queue_id=queue_id)
        print(f"{n} corrected outputs -> {args.corrections_sft}")
    return 0


def _review(args: argparse.Namespace) -> int:
    from art_langgraph.integrations.langfuse.annotation import review_folder
    from art_langgraph.integrations.langfuse.review import calibrate

    if args.langfuse_command == "calibrate":
        cal = calibrate(args.folder, queue=args.queue, dataset_run_id=args.dataset_run)
        print(cal.line())
        if cal.warning:
            print(f"warning: {cal.warning}", file=sys.stderr)
        return 0
    reports = review_folder(
        args.folder,
        queue=args.queue,
        split=args.split,
        step=args.step,
        fraction=args.fraction,
        disagreements=args.disagreements,
        near_median=args.near_median,
        seed=args.seed,
    )
    sent = sum(r.sent for r in reports)
    already = sum(r.already for r in reports)
    unsent = sum(r.unsent for r in reports)
    picked = sum(len(r.picks) for r in reports)
    print(
        f"{picked} rollouts picked in {len(reports)} steps: {sent} added to {args.queue!r}, "
        f"{already} were in it"
    )
    if unsent:
        errors = {r.error for r in reports if r.error}
        print(f"{unsent} not sent ({'; '.join(sorted(errors))})", file=sys.stderr)
        return 1
    return 0


def _model_folder(model: str, path: str = ".art", project: str | None = None) -> Path:
    """A model's folder: `model` itself if it is one (it has `checkpoints/`), else
    `{path}/{project}/models/{model}`, in any project when `project` is None."""
    from art_langgraph.backend.checkpoints import CheckpointFolder
    from art_langgraph.runtime.names import check_path_name

    given = CheckpointFolder(model)
    if given.has_checkpoints():
        return given.root
    check_path_name(model, "model name")
    root = Path(path)
    if project is not None:
        at = CheckpointFolder.of(root, check_path_name(project, "project"), model)
        found = [at] if at.has_checkpoints() else []
    else:
        found = CheckpointFolder.find(root, model)
    if len(found) == 1:
        return found[0].root
    if len(found) > 1:
        projects = ", ".join(f.project for f in found)
        raise UsageError(f"model {model!r} is in several projects ({projects}): pass --project")
    known = sorted(f"{f.project}/{f.root.name}" for f in CheckpointFolder.all(root))
    where = f"project {project!r} under {root}" if project else str(root)
    raise UsageError(
        f"no model {model!r} in {where} (models there: {', '.join(known) or 'none'}); "
        "pass --path, --project, or the model's folder"
    )


def _promotion(args: argparse.Namespace) -> int:
    from art_langgraph.backend.checkpoints import CheckpointFolder
    from art_langgraph.backend.promotion import PromotionLog

    folder = _model_folder(args.model, args.path, args.project)
    plog = PromotionLog(folder)
    if not plog.file.exists():
        print(
            f"art-langgraph: note: {folder.name} has no promotion history yet; the bare name "
            "follows it only with ModelConfig(promote_on_evaluation=True)",
            file=sys.stderr,
        )
    steps = CheckpointFolder(folder).steps()
    d = plog.promote(args.step, steps) if args.command == "promote" else plog.rollback(steps)
    print(f"{folder.name}: serving step {d.served} ({d.reason})")
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # run as a program: on tcmalloc where installed (allocator.py)
        reexec_with_tcmalloc()
    args = _parser().parse_args(argv)
    if args.command == "serve":
        from art_langgraph.serving.runner import serve

        try:
            serve(
                args.base_model,
                host=args.host,
                port=args.port,
                api_key=args.api_key or None,
                served_name=args.served_name,
                chat_template=args.chat_template,
                log_level=args.log_level,
            )
        except UsageError as exc:
            print(f"art-langgraph: error: {exc}", file=sys.stderr)
            return 2
    elif args.command == "report":
        from art_langgraph.review_page import write_review_page

        try:
            print(write_review_page(args.folder, args.out))
        except UsageError as exc:
            print(f"art-langgraph: error: {exc}", file=sys.stderr)
            return 2
    elif args.command in ("promote", "rollback"):
        try:
            return _promotion(args)
        except UsageError as exc:
            print(f"art-langgraph: error: {exc}", file=sys.stderr)
            return 2
    elif args.command == "langfuse":
        try:
            return _langfuse(args)
        except (UsageError, ImportError) as exc:
            print(f"art-langgraph: error: {exc}", file=sys.stderr)
            return 2
    elif args.command == "backend":
        from art_langgraph.backend.api.server import serve_backend

        engine_config: object = None
        if args.engine == "vllm":
            from art_langgraph.engine.vllm_config import VLLMEngineConfig

            engine_config = VLLMEngineConfig(dtype=args.engine_dtype or "auto")
        elif args.engine_dtype:
            from art_langgraph.engine.torch_engine import TorchEngineConfig

            engine_config = TorchEngineConfig(dtype=args.engine_dtype)
        try:
            serve_backend(
                args.path,
                host=args.host,
                port=args.port,
                api_key=args.api_key or None,
                log_level=args.log_level,
                engine_config=engine_config,
                engine=args.engine,
                trainer_ranks=args.trainer_ranks,
                replicas=args.replicas,
                ray=args.ray,
                trainer_fsdp={"auto": None, "on": True, "off": False}[args.trainer_fsdp],
            )
        except UsageError as exc:
            print(f"art-langgraph: error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
