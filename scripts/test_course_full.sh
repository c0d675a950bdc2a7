#!/usr/bin/env bash
# Every chapter of the course in full mode (MINENGINE_FAST unset, what a learner's Run All does): the full-mode tests
# alone (tests/course/test_full_mode.py, which the whole suite also runs), on two workers, one half of the chapters each.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1
python3 -m pytest -q -n 2 --dist loadscope tests/course/test_full_mode.py "$@"
