"""The catalogue of known-bad specs: each snippet and the diagnostic it must produce.

Each entry: (id, expected code, expected line, expected column, a phrase the message
must contain, source). Used by tests/test_diagnostics.py and quoted in
docs/diagnostics.md.
"""

BASE = """model {
  params = 1e9
}

mesh {
  dp = 8
}
"""


def spec(extra: str, imports: str = "from std.data import ddp, zero1, zero3\n") -> str:
    return imports + BASE + extra


FOLD = ("from std.data import zero1\nfrom std.tensor import megatron_tp\nfrom std.pipeline import gpipe\n"
        "model {{\n  transformer {{ hidden = 64  layers = 2  heads = 4  vocab = 128  experts = 6  top_k = 2 }}\n"
        "  group {}\n}}\nmesh {{ d = 2  t = 2  p = 2 }}\nplan p {{ d: zero1  t: megatron_tp  p: gpipe }}\n")

# two import lines, a model on three axes x, y, z, and the plan's body on line 7
PRODUCT = ("{}\nmodel {{ transformer {{ hidden = 64  layers = 2  heads = 4  vocab = 128 }} }}\n\n\n"
           "mesh {{ x = 2  y = 2  z = 2 }}\nplan p {{ {} }}\n")


# BASE plus the default import spans 8 lines; snippets appended start on line 9.
CATALOGUE = [
    ("unexpected-character", "PL001", 9, 12, "unexpected character '$'",
     spec("plan p { dp$ ddp }\n")),
    ("trailing-garbage", "PL002", 9, 20, "unexpected '}'",
     spec("plan p { dp: ddp } }\n")),
    ("missing-colon", "PL113", 9, 10, "a plan has no setting 'dp'",
     spec("plan p { dp ddp }\n")),
    ("unterminated-block", "PL003", 10, 10, "unterminated block",
     spec("plan p {\n  dp: ddp\n")),
    ("unterminated-string", "PL004", 10, 8, "unterminated string",
     spec("plan p { dp: ddp }\nassert \"fits: memory(p) <= 80 GiB\n")),
    ("number-overflow", "PL005", 9, 9, "cannot read",
     spec("let x = 1e999\n")),
    ("undefined-name", "PL101", 9, 9, "undefined name 'psy'",
     spec("let x = psy * 2\n")),
    ("misspelt-strategy", "PL101", 9, 14, "undefined strategy 'zero4'",
     spec("plan p { dp: zero4 }\n")),
    ("library-not-imported", "PL101", 9, 14, "undefined strategy 'zero2'",
     spec("plan p { dp: zero2 }\n")),
    ("duplicate-plan", "PL102", 10, 1, "plan 'p' is defined twice",
     spec("plan p { dp: ddp }\nplan p { dp: zero1 }\n")),
    ("unknown-state", "PL103", 9, 14, "unknown state 'parms'",
     spec("strategy s = ddp\nstrategy t { parms: R optimizer: R grads: R activations: R }\n".replace(
         "strategy s = ddp\n", ""))),
    ("unknown-mode", "PL104", 9, 26, "unknown mode 'Q'",
     spec("strategy t = data(S*, S, Q, R)\n")),
    ("missing-state", "PL105", 9, 1, "does not place activations",
     spec("strategy t { role = data params: R optimizer: S grads: S }\n")),
    ("duplicate-axis", "PL106", 10, 3, "axis 'dp' is declared twice",
     "from std.data import ddp\nmodel {\n  params = 1e9\n}\n\nmesh {\n  dp = 8\n  tp = 2\n  dp = 4\n}\n"
     .replace("\n  tp = 2\n  dp = 4\n}", "\n  tp = 2\n\n\n  dp = 4\n}").replace("\n\n\n  dp = 4", "\n\n  dp = 4")),
    ("axis-size-zero", "PL107", 7, 8, "must be a positive integer, not 0",
     "from std.data import ddp\nmodel {\n  params = 1e9\n}\n\nmesh {\n  dp = 0\n}\n"),
    ("axis-size-fraction", "PL107", 7, 8, "must be a positive integer, not 2.5",
     "from std.data import ddp\nmodel {\n  params = 1e9\n}\n\nmesh {\n  dp = 2.5\n}\n"),
    ("axis-bound-twice", "PL108", 9, 18, "axis 'dp' is bound twice",
     spec("plan p { dp: ddp dp: zero1 }\n")),
    ("undefined-axis", "PL109", 9, 10, "'tp' is neither a mesh axis nor a state",
     spec("plan p { tp: ddp dp: ddp }\n")),
    ("strategy-cycle", "PL110", 9, 1, "cycle",
     spec("strategy a extends b { }\nstrategy b extends a { }\n")),
    ("unknown-module", "PL111", 1, 1, "no library module 'std.zer'",
     spec("", imports="from std.zer import zero3\n")),
    ("unknown-model-property", "PL113", 2, 3, "has no property 'parms'",
     "model {\n  parms = 1e9\n}\n"),
    ("bad-property-value", "PL114", 9, 30, "'recompute' must be one of",
     spec("plan p { dp: ddp recompute = sometimes }\n")),
    ("arity-mismatch", "PL115", 9, 10, "spans 2 axes",
     spec("plan p { dp: hybrid_shard }\n", imports="from std.data import hybrid_shard\n")),
    ("mode-bound-to-axis", "PL116", 9, 14, "bound to a strategy, not to a mode",
     spec("plan p { dp: S* }\n")),
    ("query-not-a-plan", "PL117", 10, 15, "'q' is not a plan",
     spec("plan p { dp: ddp }\nassert memory(q) <= 80 GiB\n")),
    ("plans-without-model", "PL118", 3, 1, "plans need a model block",
     "from std.data import ddp\nmesh { dp = 8 }\nplan p { dp: ddp }\n"),
    ("duplicate-property", "PL119", 3, 3, "'params' is given twice",
     "model {\n  params = 1e9\n  params = 2e9\n}\n"),
    ("shorthand-length", "PL120", 9, 14, "needs 4 modes",
     spec("strategy t = data(S*, S, S)\n")),
    ("unknown-role", "PL121", 9, 14, "unknown role 'date'",
     spec("strategy t = date(R, R, R, R)\n")),
    ("bad-override", "PL122", 9, 18, "'grads' has no override 'sum'",
     spec("plan p { dp: ddp override grads: sum over (dp) }\n")),
    ("not-modelled", "PL129", 9, 18, "'process_group' is not modelled by the checker",
     spec("plan p { dp: ddp override process_group: reduce over (dp) }\n")),
    ("undeclared-loss-term", "PL186", 9, 18, "names a loss term the model's losses section does not declare",
     spec("plan p { dp: ddp override loss[aux]: per_microbatch_mean }\n")),
    ("loss-term-name", "PL289", 4, 12, "clashes with a reserved word or a parameter group's name",
     "from std.data import ddp\nmodel {\n  params = 1e9\n  losses { router = per_sequence_mean }\n}\n"
     "mesh { dp = 8 }\nplan p { dp: ddp }\n"),
    ("sequence-count-statement", "PL299", 7, 19, "states equal sequence counts, but the kl term is normalised",
     "from std.data import ddp\nmodel {\n  params = 1e9\n  losses { kl = global_mean }\n}\nmesh { dp = 8 }\n"
     "plan p { dp: ddp  override tokens[kl]: equal }\n"),
    ("stats-scope-term", "PL213", 4, 29, "states the scope of the routing statistics of a term",
     "from std.data import ddp\nmodel {\n  params = 1e9\n  losses { z = global_mean  aux_stats = per_sequence }\n}\n"
     "mesh { dp = 8 }\nplan p { dp: ddp }\n"),
    ("stats-axis", "PL215", 8, 36, "the ranks of tp hold the same tokens",
     "from std.data import ddp\nfrom std.tensor import megatron_tp\nmodel {\n"
     "  transformer { hidden = 1024  layers = 8  heads = 16  vocab = 32000  experts = 8  top_k = 2 }\n"
     "  losses { aux = per_microbatch_mean  aux_stats = per_microbatch }\n}\nmesh { dp = 8  tp = 2 }\n"
     "plan p { dp: ddp  tp: megatron_tp  override loss[aux]: stats_per_microbatch over (tp) }\n"),
    ("stats-one-cell", "PL264", 7, 19, "the path does not gather the statistics over microbatches",
     "from std.data import ddp\nmodel {\n"
     "  transformer { hidden = 1024  layers = 8  heads = 16  vocab = 32000  experts = 8  top_k = 2 }\n"
     "  losses { aux = per_microbatch_mean  aux_stats = per_microbatch }\n}\nmesh { dp = 8 }\n"
     "plan p { dp: ddp  override loss[aux]: stats_equal_microbatch_weights }\n"),
    ("capacity-never-drops", "PL265", 7, 19, "no token is dropped and the statement changes nothing",
     "from std.data import ddp\nmodel {\n  transformer { hidden = 1024  layers = 8  heads = 16  vocab = 32000  "
     "experts = 8  top_k = 2  capacity_factor = 4 }\n"
     "  losses { aux = per_microbatch_mean  aux_stats = global_batch }\n}\nmesh { dp = 8 }\n"
     "plan p { dp: ddp  override loss[aux]: stats_after_capacity }\n"),
    ("capacity-no-experts", "PL273", 7, 19, "the model has no experts",
     "from std.data import ddp\nmodel {\n  transformer { hidden = 1024  layers = 8  heads = 16  vocab = 32000 }\n"
     "  seq = 2048\n}\nmesh { dp = 8 }\n"
     "plan p { dp: ddp  override capacity: counts_padding }\n"),
    ("capacity-padding-never-drops", "PL274", 7, 19, "padded or not, so no token is dropped",
     "from std.data import ddp\nmodel {\n  transformer { hidden = 1024  layers = 8  heads = 16  vocab = 32000  "
     "experts = 8  top_k = 2  capacity_factor = 4 }\n"
     "  seq = 2048\n}\nmesh { dp = 8 }\n"
     "plan p { dp: ddp  override capacity: counts_padding }\n"),
    ("capacity-renormalise-top1", "PL275", 7, 19, "a token keeps its one expert or none",
     "from std.data import ddp\nmodel {\n  transformer { hidden = 1024  layers = 8  heads = 16  vocab = 32000  "
     "experts = 8  top_k = 1  capacity_factor = 1 }\n"
     "  seq = 2048\n}\nmesh { dp = 8 }\n"
     "plan p { dp: ddp  override capacity: renormalise_kept }\n"),
    ("capacity-renormalise-unchanged", "PL290", 7, 19, "which is 1, changes neither",
     "from std.data import ddp\nmodel {\n  transformer { hidden = 1024  layers = 8  heads = 16  vocab = 32000  "
     "experts = 8  top_k = 2  capacity_factor = 1 }\n"
     "  seq = 2048\n}\nmesh { dp = 8 }\n"
     "plan p { dp: ddp  override capacity: renormalise_dropped }\n"),
    ("impossible-shape", "PL130", 8, 10, "the attention heads (30) cannot be split evenly over tp (4)",
     "from std.tensor import megatron_tp\n"
     "model { transformer { hidden = 960  layers = 2  heads = 30  vocab = 128 } }\n"
     "mesh { tp = 4 }\n\n\n\n\nplan p { tp: megatron_tp }\n"),
    ("impossible-fold", "PL131", 6, 3, "the expert count (6) cannot be split evenly over the expert group's",
     FOLD.format("experts { role = {t: expert, d: expert} }")),
    ("product-of-a-two-axis-strategy", "PL115", 7, 10, "spans 2 axes (replicate, shard) but is bound to 3",
     PRODUCT.format("from std.data import hybrid_shard\nfrom std.tensor import megatron_tp", "[x, y, z]: hybrid_shard")),
    ("product-repeats-an-axis", "PL108", 7, 10, "an axis appears twice in this binding",
     PRODUCT.format("from std.tensor import megatron_tp\nfrom std.data import ddp", "[x, x]: megatron_tp  [y, z]: ddp")),
    ("product-of-pipeline-stages", "PL132", 7, 10, "pipeline strategy 'gpipe' is bound to a product of axes [x, y]",
     PRODUCT.format("from std.pipeline import gpipe\nfrom std.data import ddp", "[x, y]: gpipe  z: ddp")),
    ("product-placed-differently", "PL132", 7, 10, "the axes of the product [x, y] are placed differently (params)",
     PRODUCT.format("from std.tensor import megatron_tp\nfrom std.data import ddp",
                    "[x, y]: megatron_tp  z: ddp  params: {x: R}")),
    ("split-weight-replicated-grads", "PL136", 7, 39, "gradients R on tensor axis 'x', whose params are split",
     PRODUCT.format("from std.tensor import megatron_tp\nfrom std.data import ddp",
                    "x: megatron_tp  [y, z]: ddp  grads: {x: R}")),
    ("group-grads-replicated-on-split-weights", "PL136", 6, 3, "for group 'vision'",
     FOLD.format("vision { count = 1000  grads = {t: R} }")),
    ("pipeline-replicated-params", "PL137", 7, 33, "params R on pipeline axis 'x'",
     PRODUCT.format("from std.pipeline import gpipe\nfrom std.data import ddp", "x: gpipe  [y, z]: ddp  params: {x: R}")),
    ("group-params-gathered-over-stages", "PL137", 6, 3, "params S* on pipeline axis 'p' for group 'vision'",
     FOLD.format("vision { count = 1000  params = {p: S*} }")),
    ("fold-on-a-dense-group", "PL131", 6, 3, "only an expert group may take roles of its own",
     FOLD.format("attention { role = {d: expert} }")),
    ("fold-over-the-pipeline", "PL131", 6, 3, "gives the pipeline axis p the role data",
     FOLD.format("experts { role = {p: data} }")),
    ("fold-expert-width", "PL131", 5, 3, "the expert width (98) cannot be split evenly over the expert group's "
     "tensor axes d×t (4)",
     "from std.data import zero1\nfrom std.tensor import megatron_sp\nmodel {\n"
     "  transformer { hidden = 64  layers = 2  heads = 4  ffn = 98  vocab = 128  experts = 4  top_k = 2 }\n"
     "  group experts { role = {d: tensor, e: expert} }\n}\nmesh { d = 2  e = 2  t = 2 }\n\n"
     "plan p { d: zero1  e: zero1  t: megatron_sp }\n"),
    ("fold-tensor-without-sequence-parallelism", "PL133", 9, 20, "the expert group folds the tensor axis t (2) "
     "into other roles (t: expert) without sequence parallelism", FOLD.format("experts { role = {t: expert} }")),
    ("unknown-fold-role", "PL121", 6, 30, "'pipeline' is not a role an axis may play",
     FOLD.format("experts { role = {d: pipeline} }")),
    ("unknown-strategy-argument", "PL123", 11, 39, "has no parameter 'w'",
     spec("plan p { dp: ddp pp: interleaved_1f1b(w = 2) }\n",
          imports="from std.data import ddp\nfrom std.pipeline import interleaved_1f1b\n").replace(
         "mesh {\n  dp = 8\n}", "mesh {\n  dp = 8\n  pp = 4\n}")),
    ("option-needs-gather", "PL124", 9, 29, "applies to a sharded-with-gather (S*) state only",
     spec("plan p { dp: ddp params: R (prefetch = 2) }\n".replace("plan p { dp: ddp params: R (prefetch = 2) }",
          "plan p { dp: ddp params: R (prefetch = 2) }"))),
    ("unbound-axis", "PL125", 10, 1, "binds no strategy to axis tp",
     spec("plan p { dp: ddp }\n").replace("mesh {\n  dp = 8\n}", "mesh {\n  dp = 8\n  tp = 2\n}")),
    ("let-cycle", "PL126", 9, 1, "cycle",
     spec("let a = b + 1\nlet b = a * 2\n")),
    ("use-of-placing-strategy", "PL127", 9, 18, "places states",
     spec("plan p { dp: ddp use zero1 }\n")),
    ("bytes-plus-count", "PL201", 9, 9, "cannot add bytes and a plain count",
     spec("let x = 80 GiB + 3\n")),
    ("unit-on-axis-size", "PL202", 7, 8, "a byte unit does not fit here",
     "from std.data import ddp\nmodel {\n  params = 1e9\n}\n\nmesh {\n  dp = 8 GB\n}\n"),
    ("unit-on-param-count", "PL202", 2, 12, "a byte unit does not fit here",
     "model {\n  params = 7 GB\n}\n"),
    ("symbolic-exponent", "PL203", 9, 13, "whole-number constant",
     spec("let x = 2 ^ dp\n")),
    ("division-by-zero", "PL204", 9, 13, "division by zero",
     spec("let x = 8 / 0\n")),
    ("division-by-zero-through-let", "PL204", 10, 9, "1 / z divides by zero",
     spec("let z = 0\nlet w = 1 / z\n")),
    ("division-by-zero-folded", "PL204", 9, 9, "divides by zero",
     spec("let w = 1 / (2 - 2)\n")),
    ("exponent-tower", "PL209", 9, 9, "too large to hold exactly",
     spec("let t = ((10^64)^64)^64\n")),
    ("exponent-tower-deep", "PL209", 9, 9, "too large to hold exactly",
     spec("let t = ((((10^64)^64)^64)^64)^64\n")),
    ("product-too-large", "PL209", 10, 9, "too large to hold exactly",
     spec("let a = (2^64)^64\nlet b = a * a * a * a\n")),
    ("unknown-function", "PL205", 9, 9, "unknown function 'sqrt'",
     spec("let x = sqrt(4)\n")),
    ("query-outside-question", "PL205", 10, 9, "only allowed in assert and claim",
     spec("plan p { dp: ddp }\nlet x = memory(p)\n")),
    ("query-arguments", "PL206", 10, 8, "takes a plan and optionally a state",
     spec("plan p { dp: ddp }\nassert memory(p, params, grads) <= 1 GB\n")),
    ("bytes-times-bytes", "PL207", 9, 9, "bytes times bytes",
     spec("let x = 2 GB * 3 GB\n")),
    ("compare-bytes-with-count", "PL201", 10, 8, "cannot compare bytes with a plain count",
     spec("plan p { dp: ddp }\nassert memory(p) <= 80\n")),
    ("unknown-optimizer", "PL240", 12, 13, "unknown optimizer algorithm 'muonn'",
     spec("plan p {\n  dp: zero1\n  optimizer {\n    dense = muonn\n  }\n}\n")),
    ("optimizer-gather-elementwise", "PL245", 11, 3, "reaches nothing",
     spec("plan p {\n  dp: zero1\n  override optimizer: gather over (dp)\n}\n")),
    ("gathered-loss-axis", "PL292", 6, 66, "which is not a context axis",
     "from std.data import ddp\nfrom std.context import context_parallel\n"
     "model {\n  params = 1e9\n}\nmesh { dp = 8  sp = 2 }  plan p { dp: ddp  sp: context_parallel  "
     "override loss: on_gathered_sequence over (dp) }\n"),
    ("gathered-loss-count", "PL293", 8, 3, "not modelled by the checker",
     "from std.data import ddp\nfrom std.context import context_parallel\n"
     "model {\n  params = 1e9\n}\nmesh { dp = 8  sp = 2 }\n"
     "plan p { dp: ddp  sp: context_parallel  override loss: on_gathered_sequence over (sp)\n"
     "  override tokens: clamp_before_reduce }\n"),
]
