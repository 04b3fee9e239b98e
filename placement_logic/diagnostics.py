"""Diagnostics: one type for every error the toolkit reports.

Input: a code, a message and a source span. Output: the stable one-line form
``file:line:col: error: message [PL123]``, a source snippet with a caret under the
span, or a JSON-ready dict. Every code is catalogued in ``CODES`` with a one-line
description and named in ``Code`` (``Code.BAD_PROPERTY_VALUE`` is ``"PL114"``);
``docs/diagnostics.md`` documents each one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Iterable

from .codes import CODES  # noqa: F401 (re-exported: code -> (short name, one-line description))
from .spans import BUILTIN, COMMAND_LINE, NO_SPAN, UNLOCATED, Severity, Span  # noqa: F401 (re-exported)


class Code(StrEnum):
    """The diagnostic codes by name: ``Code.UNEXPECTED_TOKEN == "PL002"``.

    A member is the code's string itself (``str``, f-strings, ``==``, JSON and dict keys read
    ``"PL002"``); each is named from its short name in ``CODES`` and the two agree one to one.
    """

    UNEXPECTED_CHARACTER = "PL001"
    UNEXPECTED_TOKEN = "PL002"
    UNEXPECTED_END = "PL003"
    UNTERMINATED_STRING = "PL004"
    BAD_NUMBER = "PL005"
    UNREADABLE_FILE = "PL006"
    TOO_DEEP = "PL007"
    UNDEFINED_NAME = "PL101"
    DUPLICATE_DEFINITION = "PL102"
    UNKNOWN_STATE = "PL103"
    UNKNOWN_MODE = "PL104"
    MISSING_STATE = "PL105"
    DUPLICATE_AXIS = "PL106"
    BAD_AXIS_SIZE = "PL107"
    AXIS_REUSED = "PL108"
    UNDEFINED_AXIS = "PL109"
    STRATEGY_CYCLE = "PL110"
    UNKNOWN_MODULE = "PL111"
    IMPORT_CYCLE = "PL112"
    UNKNOWN_PROPERTY = "PL113"
    BAD_PROPERTY_VALUE = "PL114"
    ARITY_MISMATCH = "PL115"
    NOT_A_STRATEGY = "PL116"
    NOT_A_PLAN = "PL117"
    MISSING_SECTION = "PL118"
    DUPLICATE_PROPERTY = "PL119"
    BAD_TUPLE = "PL120"
    UNKNOWN_ROLE = "PL121"
    BAD_OVERRIDE = "PL122"
    UNKNOWN_PARAMETER = "PL123"
    MODE_OPTION = "PL124"
    UNBOUND_AXIS = "PL125"
    DEFINITION_CYCLE = "PL126"
    AXIS_LESS_STRATEGY = "PL127"
    CONFLICTING_SETTING = "PL128"
    NOT_MODELLED = "PL129"
    IMPOSSIBLE_SHAPE = "PL130"
    IMPOSSIBLE_FOLD = "PL131"
    PRODUCT_BINDING = "PL132"
    FOLD_NEEDS_SEQUENCE_PARALLEL = "PL133"
    SPLIT_WEIGHT_REPLICATED_GRADS = "PL136"
    PIPELINE_REPLICATED_PARAMS = "PL137"
    BAD_CONFIG = "PL140"
    BAD_FRAMEWORK_CONFIG = "PL141"
    SEES_HEADS_SPLIT = "PL142"
    FILTER_ON_SHARDS = "PL150"
    SEARCH_INPUT = "PL151"
    UNRESOLVED_AUTO = "PL160"
    TRAINER_MISMATCH = "PL161"
    LAUNCH_LINE_DEVICES = "PL162"
    PARAMS_BELOW_SHAPE = "PL163"
    RANK0_UNREDUCED_AXIS = "PL170"
    NESTED_ACCUMULATION = "PL171"
    CHECKPOINT_PLAN_WIDE = "PL180"
    BLOCKS_UNREDUCED_AXIS = "PL181"
    NORM_BLOCKS_AXIS = "PL182"
    BLOCK_SIZE = "PL183"
    RANK_SET_DIVISORS = "PL184"
    UNDECLARED_LOSS_TERM = "PL186"
    LOSS_TERM_REACHES_NOTHING = "PL187"
    ACTIVATION_ASSERT_OFF_TENSOR = "PL190"
    RANK_OUT_OF_RANGE = "PL191"
    RANK_SET_AXES = "PL192"
    PARTITION_TWICE = "PL194"
    ULYSSES_HEADS = "PL197"
    UNIT_MISMATCH = "PL201"
    UNIT_NOT_ALLOWED = "PL202"
    BAD_EXPONENT = "PL203"
    DIVISION_BY_ZERO = "PL204"
    UNKNOWN_FUNCTION = "PL205"
    BAD_ARGUMENTS = "PL206"
    BYTES_SQUARED = "PL207"
    UNKNOWN_UNIT = "PL208"
    NUMBER_TOO_LARGE = "PL209"
    STATS_SCOPE_TERM = "PL213"
    STATS_SCOPE_UNSTATED = "PL214"
    STATS_AXIS = "PL215"
    UNKNOWN_OPTIMIZER = "PL240"
    OPTIMIZER_ARGUMENT = "PL241"
    OPTIMIZER_GROUP = "PL242"
    OPTIMIZER_ON_VECTORS = "PL243"
    OPTIMIZER_TWICE = "PL244"
    OPTIMIZER_GATHER_ELEMENTWISE = "PL245"
    OPTIMIZER_GATHER_IDLE = "PL246"
    GROUP_SIZES = "PL250"
    GROUPS_AXIS = "PL251"
    CE_TERM_UNSTATED = "PL253"
    RANK_NEVER_IN_RANGE = "PL259"
    NORM_RANK_SETS_TWICE = "PL260"
    STATS_ONE_CELL = "PL264"
    CAPACITY_NEVER_DROPS = "PL265"
    RANK_SETS_OVERLAP = "PL267"
    RANK_SETS_COVER = "PL268"
    RANK_SETS_AXIS = "PL269"
    ROUTER_COUNTS_PIPELINE = "PL270"
    AMAX_LOCAL_AND_REDUCED = "PL271"
    CAPACITY_NO_EXPERTS = "PL273"
    CAPACITY_PADDING_NEVER_DROPS = "PL274"
    CAPACITY_RENORMALISE_TOP1 = "PL275"
    HEADS_RULE_GROUP = "PL276"
    HEADS_NO_ULYSSES = "PL277"
    PARTIAL_OP_REGION = "PL278"
    PARTIAL_OP_VERB = "PL279"
    TERM_DIVISOR_EVERY_RANK = "PL280"
    TERM_RANK_SETS_TWICE = "PL281"
    WINDOW_GROUP = "PL282"
    WINDOW_SIZE = "PL283"
    AMAX_BLOCKS_NO_SHAPES = "PL284"
    AMAX_BLOCK_SIZE = "PL285"
    LAYOUT_SHORT_MIXED = "PL286"
    CHECKPOINT_FUSED_COUNT = "PL287"
    CHECKPOINT_FUSED_AXIS = "PL288"
    LOSS_TERM_NAME = "PL289"
    CAPACITY_RENORMALISE_UNCHANGED = "PL290"
    OVERRIDE_RESTATED = "PL291"
    GATHERED_LOSS_AXIS = "PL292"
    GATHERED_LOSS_COUNT = "PL293"
    CHUNK_SIZE = "PL294"
    CHUNK_GROUP = "PL295"
    MTP_STAGE_AXIS = "PL296"
    PACKED_WITHOUT_STATS = "PL297"
    MICROSTEP_REDUCE_CONFLICT = "PL298"
    SEQUENCE_COUNT_STATEMENT = "PL299"
    BAD_SET = "PL301"
    UNKNOWN_PLAN = "PL302"
    SWEEP_TOO_LARGE = "PL310"
    SWEEP_UNBOUND = "PL311"
    PLOT_UNAVAILABLE = "PL312"
    BAD_PLOT = "PL313"
    SWEEP_OPTION = "PL314"
    CALIBRATE_UNAVAILABLE = "PL315"
    BAD_TIMEOUT = "PL500"
    OVERRIDE_AXIS = "PL501"
    TIE_AXIS = "PL502"
    CHECK_VALUE = "PL503"
    UNBOUND_CHECK_SYMBOL = "PL504"
    TRANSIENT_PERSISTENT_STATE = "PL505"
    OVERRIDE_NO_EFFECT = "PL506"
    BAD_VALUE_EXPRESSION = "PL400"
    QUERY_NOT_ALLOWED = "PL401"
    BAD_QUERY_ARGUMENT = "PL402"
    UNKNOWN_QUERY = "PL403"
    TORCH_MISSING = "PL601"
    BAD_DEVICES = "PL602"
    BAD_STEPS = "PL604"
    TORCHRUN_ENV = "PL620"
    TORCHRUN_DEVICES = "PL621"
    BAD_TRACE_COMMAND = "PL611"
    BAD_TRACE = "PL612"
    TRACE_FAILED = "PL613"
    NOT_LIFTABLE = "PL614"
    EXPORT_FAILED = "PL700"


@dataclass(frozen=True)
class Diagnostic:
    """One located message: its code, text, span, severity and notes."""

    code: str
    message: str
    span: Span = NO_SPAN
    severity: Severity = Severity.ERROR
    notes: tuple[str, ...] = field(default=())

    def one_line(self) -> str:
        s = self.span
        where = f"{s.file}:{s.line}:{s.column}" if s.located else "placement"
        return f"{where}: {self.severity.value}: {self.message} [{self.code}]"

    def to_json(self) -> dict:
        s = self.span
        return {
            "code": self.code,
            "name": CODES.get(self.code, ("", ""))[0],
            "severity": self.severity.value,
            "message": self.message,
            "file": s.file if s.located else None,
            "line": s.line if s.located else None,
            "column": s.column if s.located or s.text else None,
            "end_line": s.end_line if s.located else None,
            "end_column": s.end_column if s.located or s.text else None,
            **({"argument": s.text} if s.text else {}),
            "notes": list(self.notes),
        }


class DiagnosticError(Exception):
    """Raised by the front end with one or more diagnostics; never escapes the CLI."""

    def __init__(self, diagnostics: Iterable[Diagnostic], sources: dict[str, str] | None = None):
        self.diagnostics = tuple(diagnostics)
        self.sources = dict(sources or {})  # file -> text, for snippets
        super().__init__("\n".join(d.one_line() for d in self.diagnostics))


def did_you_mean(name: str, candidates: Iterable[str]) -> tuple[str, ...]:
    """A 'did you mean' note for a misspelt name, or nothing."""
    import difflib  # only when a name is not found

    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return (f"did you mean '{close[0]}'?",) if close else ()
