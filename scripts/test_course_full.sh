#!/usr/bin/env bash
# Every chapter of the course in full mode (MINENGINE_FAST unset), chapter 10's real-fleet replay included, which
# the README's test command leaves out (tests/course/test_full_mode.py). About half an hour of one core.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1 MINENGINE_COURSE_FULL_ALL=1
python3 -m pytest -q -n 2 --dist loadscope tests/course/test_full_mode.py "$@"
