"""``export``, ``evaluate``: a trained model as one file, and its test AUC on one machine (docs/export.md)."""
from __future__ import annotations

import json
from pathlib import Path

from hybrid.cli.output import finite, say, text_out


def cmd_export(args) -> int:
    """Write checkpoint ``args.checkpoint``'s tables and MLP to ``args.out``."""
    from hybrid.training.export import export_checkpoint

    written = export_checkpoint(args.checkpoint, args.out, say=lambda line: print(line, file=text_out(args)))
    if args.json:
        print(json.dumps(written))
    return 0


def cmd_evaluate(args) -> int:
    """AUC and log loss of an exported model on a store's test split (or all of it)."""
    from hybrid.data.store import BatchStore
    from hybrid.exported import evaluate, load

    model = load(args.model)
    fraction = model.config["data"]["test_fraction"] if args.test_fraction is None else args.test_fraction
    split = "test" if fraction > 0 else "all"
    store = BatchStore(args.store, split=split, test_fraction=fraction)
    say(f"evaluating {args.model} on the {split} split of {args.store}")
    result = evaluate(model, store, limit=args.limit)
    print(f"{Path(args.model).name}: test AUC {result['auc']:.6f}, log loss {result['logloss']:.6f} on "
          f"{result['samples']} samples", file=text_out(args))
    if args.json:
        print(json.dumps(finite(result)))
    return 0


def register(subparsers) -> None:
    """Add ``export`` and ``evaluate``."""
    p = subparsers.add_parser("export", help="write a checkpoint's embedding tables and MLP as one file")
    p.add_argument("checkpoint", help="a checkpoint (step-* directory) or a checkpoint directory (its newest)")
    p.add_argument("--out", required=True, help="the file to write (a torch.save dict; see hybrid.exported)")
    p.add_argument("--json", action="store_true", help="print what was written as JSON on stdout")
    p.set_defaults(func=cmd_export)

    p = subparsers.add_parser("evaluate", help="test AUC and log loss of an exported model on a store")
    p.add_argument("model", help="a file written by hybrid export")
    p.add_argument("store", help="a sample store (hybrid preprocess / fetch / synth)")
    p.add_argument("--test-fraction", type=float, default=None,
                   help="the store's last fraction evaluated (default: the training config's data.test_fraction; "
                        "0 = every sample)")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N samples of the split")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(func=cmd_evaluate)
