"""The default step is the book: what one default ``LLM().generate`` executes stays small enough to read, its
functions fit a screen, and optional features enter through doors, not through branches of the default functions.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from minengine.core.doors import make_scheduler
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler import Scheduler
from minengine.core.step_builder import StepBuilder
from tests.reading_path import trace_default_generate

MAX_FILE_LINES = 4000  # non-blank lines of every file the default step executes code in
MAX_FUNCTION_LINES = 50  # non-blank lines of any function it executes
# Words of the optional features: none may appear in a branch condition of a default function.
DOOR_WORDS = ("async", "placeholder", "in_flight", "spec", "proposer", "swap", "structured", "grammar", "predicted",
              "window", "hybrid")


def branch_words(function) -> set[str]:
    """The names and attributes read by the conditions of ``function``'s branches (if, while, conditional
    expressions, comprehension filters, and / or)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    conditions = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            conditions.append(node.test)
        elif isinstance(node, ast.comprehension):
            conditions.extend(node.ifs)
        elif isinstance(node, ast.BoolOp):
            conditions.extend(node.values)
    words = set()
    for condition in conditions:
        for node in ast.walk(condition):
            if isinstance(node, ast.Name):
                words.add(node.id.lower())
            elif isinstance(node, ast.Attribute):
                words.add(node.attr.lower())
    return words


DEFAULT_FUNCTIONS = [Scheduler.schedule, Scheduler.update_from_output, Scheduler.rollback, Scheduler.commit_sampled,
                     Scheduler.commit_chunk, Scheduler.append_token, Scheduler.finish_requests, Scheduler.undo_request,
                     Scheduler.restore_waiting, StepBuilder.run, StepBuilder.preempt, StepBuilder.admit_next,
                     StepBuilder.first_chunk, StepBuilder.build, StepBuilder.scheduled_request,
                     StepBuilder.schedule_chunk]


@pytest.mark.parametrize("function", DEFAULT_FUNCTIONS, ids=lambda f: f.__qualname__)
def test_default_functions_have_no_optional_feature_branch(function):
    found = {w for w in branch_words(function) if any(door in w for door in DOOR_WORDS)}
    assert not found, f"{function.__qualname__} branches on optional features: {sorted(found)}"


def test_the_branch_check_sees_a_feature_branch():
    def default_looking(request):
        if request.num_output_placeholders and request.structured_output is not None:
            return 0
        return 1

    assert {"num_output_placeholders", "structured_output"} <= branch_words(default_looking)


def test_a_default_scheduler_opens_no_door():
    scheduler = make_scheduler(KVCacheManager(16, 4, True), 32, 4, 64)
    assert type(scheduler) is Scheduler and scheduler.step_builder_class is StepBuilder
    assert scheduler.append_token.__func__ is Scheduler.append_token


@pytest.mark.parametrize("settings, door", [
    (dict(async_scheduling=True), "AsyncScheduling"),
    (dict(preemption_mode="swap", swap_space_blocks=4), "SwapScheduling"),
    (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}), "SpeculativeScheduling"),
    (dict(reserve_predicted_kv=True), "PredictedLengths"),
    (dict(policy="shortest-predicted-first"), "PredictedLengths"),
])
def test_each_feature_opens_its_door(settings, door):
    scheduler = make_scheduler(KVCacheManager(16, 4, True), 32, 4, 64, **settings)
    assert door in [c.__name__ for c in type(scheduler).__mro__]
    assert scheduler.step_builder_class is not StepBuilder


# Files of optional features and of what runs once, at construction or on request: doors a default step never opens.
DOOR_FILES = ("minengine/structured_outputs_params.py", "minengine/metrics/prometheus_recorder.py",
              "minengine/metrics/prometheus.py", "minengine/engine/parallel_sampling.py",
              "minengine/engine/logprobs_positions.py", "minengine/engine/engine_statistics.py",
              "minengine/engine/bad_words.py", "minengine/engine/arrival_time.py",
              "minengine/engine/generation_config.py", "minengine/layers/attention_backend.py",
              "minengine/layers/triton_attention.py")


@pytest.fixture(scope="module")
def default_path():
    return trace_default_generate()


def test_the_default_step_opens_no_door_file(default_path):
    assert default_path.files and not set(DOOR_FILES) & set(default_path.files)


def test_the_prometheus_series_are_a_recorder_chosen_at_construction(bundled_model):
    from minengine import LLM
    from minengine.config import EngineConfig
    from minengine.engine.llm_engine import LLMEngine
    from minengine.metrics.prometheus_recorder import PrometheusRecorder
    from minengine.metrics.recorder import StepRecorder

    quiet = LLM(bundled_model).llm_engine  # vLLM's offline default: disable_log_stats=True
    assert type(quiet.recorder) is StepRecorder and not quiet.log_stats and quiet.stat_logger is not None
    loud = LLMEngine(EngineConfig(model=bundled_model))
    assert type(loud.recorder) is PrometheusRecorder and loud.log_stats


def test_the_default_step_reads_in_one_sitting(default_path):
    path = default_path
    assert path.total_lines <= MAX_FILE_LINES, (
        f"the default step executes code in {len(path.files)} files of {path.total_lines} non-blank lines "
        f"(at most {MAX_FILE_LINES}): {sorted(path.files.items(), key=lambda kv: -kv[1])[:8]}")
    too_long = path.longer_than(MAX_FUNCTION_LINES)
    assert not too_long, f"executed functions longer than {MAX_FUNCTION_LINES} non-blank lines: {too_long}"


def test_the_engine_file_is_the_step_loop():
    """``llm_engine.py`` holds the step loop and what a user calls on the engine, no more (400 lines)."""
    from minengine.engine import llm_engine

    lines = inspect.getsource(llm_engine).count("\n")
    assert lines <= 400, f"minengine/engine/llm_engine.py has {lines} lines (at most 400)"


def test_the_reading_page_path_reads_in_one_sitting():
    """``docs/reading_order.md``'s first table (the path a learner opens) is at most 3,000 non-blank lines."""
    from tests.repo.test_reading_order import PATH, rows

    path = rows(PATH)
    assert sum(path.values()) <= 3000, f"the reading path is {sum(path.values())} non-blank lines: {path}"
