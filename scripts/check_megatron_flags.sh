#!/usr/bin/env bash
# Every line of `plan --format megatron` on a few setups checked against the argparse flags of a
# Megatron-LM checkout: scripts/check_megatron_flags.sh [--megatron PATH] [--bin AUTOPAR_TUNE].
# Skips (exit 0) without --megatron. See scripts/check_megatron_flags.py.
set -euo pipefail
exec python3 "$(dirname "$0")/check_megatron_flags.py" "$@"
