"""Hugging Face Trainer DeepSpeed configs: ``"auto"`` values filled from the options, by the
Trainer's own rules (``HfTrainerDeepSpeedConfig.trainer_config_process`` in transformers'
``integrations/deepspeed.py``):

- ``train_micro_batch_size_per_gpu`` = ``--per_device_train_batch_size`` (``--micro-batch``);
- ``gradient_accumulation_steps`` = ``--gradient_accumulation_steps`` (``--grad-accum``);
- ``train_batch_size`` = world size × micro batch × accumulation (or ``--global-batch``, from
  which a missing micro batch or accumulation is derived);
- ``bf16.enabled`` = ``--bf16``, ``fp16.enabled`` = ``--fp16`` (``--fp32``: both false);
- ``gradient_clipping`` = ``--max_grad_norm``, the optimizer and scheduler values and, once
  the model is known, ``reduce_bucket_size`` = hidden², ``stage3_prefetch_bucket_size`` =
  0.9 hidden², ``stage3_param_persistence_threshold`` = 10 hidden: the importer drops them
  (``--verbose`` says so), so they need no value.

Every ``"auto"`` among the keys the importer reads that the options do not fill is reported
at once (PL160, each key located); a number in the config that an option contradicts is the
Trainer's own mismatch error (PL161)."""

from __future__ import annotations

from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..frontend.configs import position

AUTO = "auto"

# key -> (the Trainer argument it comes from, the option that supplies it here)
_BATCH = {"train_micro_batch_size_per_gpu": ("per_device_train_batch_size", "--micro-batch N"),
          "gradient_accumulation_steps": ("gradient_accumulation_steps", "--grad-accum N"),
          "train_batch_size": ("world size × micro batch × accumulation", "--global-batch N, or --micro-batch "
                               "and --grad-accum")}
_PRECISION = {"bf16": "--bf16", "fp16": "--fp16"}


def _span(text: str, file: str, path: tuple[str, ...]) -> Span:
    line, col, width = position(text, path)
    return Span.point(file, line, col, width)


def _where(span: Span) -> str:
    return f"{span.file}:{span.line}:{span.column}"


def resolve_auto(doc: dict, text: str, file: str, devices: int, micro: int | None, accum: int | None,
                 global_batch: int | None, precision: str | None, assumed: list[str]) -> None:
    """Fill, in ``doc``, the ``"auto"`` values the importer reads (and the batch keys an option
    gives where the config has none); each fill is appended to ``assumed``. Raises PL160 for
    every ``"auto"`` left (all at once), PL161 for a config number an option contradicts."""
    given = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
             "train_batch_size": global_batch}
    mismatches: list[Diagnostic] = []
    for key, opt in given.items():
        v = doc.get(key)
        if opt is not None and v not in (None, AUTO) and v != opt:
            span = _span(text, file, (key,))
            mismatches.append(Diagnostic(Code.TRAINER_MISMATCH, f"{key} is {v} in the config but {opt} from "
                                         f"{_BATCH[key][1].split(' N')[0]}", span,
                                         notes=('the Trainer stops on the same mismatch; write "auto" in the config '
                                                "or drop the option",)))
    if mismatches:
        raise DiagnosticError(mismatches, {file: text})
    value = {k: (doc.get(k) if isinstance(doc.get(k), int) and not isinstance(doc.get(k), bool) else given[k])
             for k in given}
    mb, gas, tb = (value[k] for k in given)
    if tb is not None and (mb is None) != (gas is None):  # derive the missing one from the global batch
        known = mb or gas
        if tb % (known * devices) == 0:
            missing = "gradient_accumulation_steps" if gas is None else "train_micro_batch_size_per_gpu"
            value[missing] = tb // (known * devices)
            if doc.get(missing) is None:
                doc[missing] = value[missing]
                assumed.append(f"{missing} = {value[missing]}: absent, derived as DeepSpeed does (global batch {tb} / "
                               f"({known} × {devices} devices))")
            elif doc.get(missing) == AUTO:
                assumed.append(f'{missing} "auto" = {value[missing]} (global batch {tb} / ({known} × {devices} '
                               "devices))")
    if tb is None and value["train_micro_batch_size_per_gpu"] and value["gradient_accumulation_steps"]:
        value["train_batch_size"] = value["train_micro_batch_size_per_gpu"] * value["gradient_accumulation_steps"] \
            * devices
    unresolved: list[tuple[tuple[str, ...], str]] = []
    for key in given:
        if doc.get(key) == AUTO:
            if value[key] is None:
                unresolved.append(((key,), f"the Trainer's {_BATCH[key][0]}; give {_BATCH[key][1]}"))
            else:
                doc[key] = value[key]
                if given[key] is not None or key == "train_batch_size":
                    how = (f" = {value['train_micro_batch_size_per_gpu']} × {value['gradient_accumulation_steps']} × "
                           f"{devices} devices" if key == "train_batch_size" and given[key] is None else "")
                    assumed.append(f'{key} "auto"{how} = {value[key]} (the Trainer\'s {_BATCH[key][0]})')
        elif key not in doc and given[key] is not None:
            doc[key] = given[key]
    for name, flag in _PRECISION.items():
        table = doc.get(name)
        if isinstance(table, dict) and table.get("enabled") == AUTO:
            if precision is None:
                unresolved.append(((name, "enabled"), f"the Trainer's {flag}; give --bf16, --fp16 or --fp32"))
            else:
                table["enabled"] = precision == name
                assumed.append(f'{name}.enabled "auto" = {str(precision == name).lower()} (the Trainer\'s {flag}: '
                               f"--{precision} given)")
    if unresolved:
        spans = [(_span(text, file, path), path, why) for path, why in unresolved]
        names = ", ".join(".".join(p) for _, p, _ in spans)
        notes = tuple(f'{_where(s)}: {".".join(p)} = "auto": {why}' for s, p, why in spans)
        raise DiagnosticError([Diagnostic(
            Code.UNRESOLVED_AUTO, f'{len(spans)} "auto" value{"s" if len(spans) > 1 else ""} the options do not fill: {names}',
            spans[0][0], notes=notes + ("the Hugging Face Trainer fills them at run time from its own arguments; "
                                        "give the same values here",))], {file: text})
