"""The `kiln` command line: `kiln ops`, `kiln targets`, `kiln target`, `kiln demo`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from kiln import __version__, registry
from kiln.errors import KilnError
from kiln.target import Target, TargetKind, TargetTag


def _cmd_ops(args: argparse.Namespace) -> None:
    if args.name:
        op = registry.Op.get(args.name)
        print(json.dumps(registry.op_record(op), indent=2) if args.json else registry.format_op(op))
    else:
        print(registry.export_json() if args.json else registry.format_table())


def _targets_record() -> dict[str, object]:
    kinds = [
        {
            "name": kind.name,
            "description": kind.description,
            "options": [
                {"name": o.name, "type": o.type, "default": o.default, "doc": o.doc} for o in kind.options
            ],
        }
        for kind in map(TargetKind.get, TargetKind.list_names())
    ]
    tags = [
        {"name": tag.name, "description": tag.description, "kind": tag.kind.name, "options": tag.options}
        for tag in map(TargetTag.get, TargetTag.list_names())
    ]
    return {"kinds": kinds, "tags": tags}


def _cmd_targets(args: argparse.Namespace) -> None:
    record = _targets_record()
    if args.json:
        print(json.dumps(record, indent=2))
        return
    for kind in map(TargetKind.get, TargetKind.list_names()):
        print(f"{kind.name}: {kind.description}")
        for o in kind.options:
            default = "" if o.default is None else f" (default {o.format(o.default)})"
            print(f"  -{o.name}: {o.type}{default}  {o.doc}")
    print("tags:")
    for tag in map(TargetTag.get, TargetTag.list_names()):
        print(f"  {Target(tag.name)!s:40}  {tag.description}")
        print(f"    = {tag.kind.name} " + " ".join(f"-{k}={v}" for k, v in tag.options.items()))


def _cmd_target(args: argparse.Namespace) -> None:
    target = Target(args.spec)
    if args.json:
        print(json.dumps(target.export(), indent=2))
        return
    print(str(target))
    for name, value in target.attrs.items():
        text = target.kind.option(name).format(value)
        if name == "mattr":
            on = [f for f in value if f.startswith("+")]
            text = f"{len(on)} enabled, {len(value) - len(on)} disabled ({', '.join(on[:8])}, ...)"
        print(f"  {name:28} {text}")


def _cmd_demo(args: argparse.Namespace) -> None:
    from kiln import demo

    demo.main()


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser of the `kiln` command."""
    parser = argparse.ArgumentParser(prog="kiln", description="kiln, a deep-learning compiler")
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    ops = sub.add_parser("ops", help="list the registered ops, or show one in full")
    ops.add_argument("name", nargs="?", help="an op name, e.g. nn.conv2d")
    ops.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ops.set_defaults(run=_cmd_ops)

    targets = sub.add_parser("targets", help="list the target kinds, their options, and the tags")
    targets.add_argument("--json", action="store_true", help="print JSON")
    targets.set_defaults(run=_cmd_targets)

    target = sub.add_parser("target", help="parse a target and show its options (default: the host)")
    target.add_argument("spec", nargs="?", default="llvm", help='e.g. "llvm -mcpu=znver4" or nvidia/h100')
    target.add_argument("--json", action="store_true", help="print JSON")
    target.set_defaults(run=_cmd_target)

    demo = sub.add_parser("demo", help="the guided tour that `make demo` runs")
    demo.set_defaults(run=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `kiln` command; returns its exit status."""
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except KilnError as err:
        print(f"kiln: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kiln ops | head`
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
