"""Plan assembly: a plan definition over the mesh and model -> ``ir.Plan``.

A plan starts from the plan it extends (if any), binds expanded strategies to mesh axes
(renaming their formal axes), takes settings and overrides from ``use``d strategies and
its own body, applies its own placement entries last, and must end with every mesh axis
bound and every state placed on every axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir
from ..diagnostics import Code, Span, did_you_mean
from ..frontend import surface
from ..ir import capacity, capdrop, lossgather, restated, routerstats, ulysses_split
from ..ir import router as router_stmt
from ..ir.welltyped import ill_typed
from .entries import override, placement_entry, rename_override, setting
from .optimizers import check_overrides as check_optimizer_overrides
from .optimizers import section as optimizer_section
from .scopes import ModuleScope, lookup_strategy
from .shapes import check_shapes
from .strategies import Expanded, Expander
from .values import STATE_NAMES, Values

PLAN_SETTINGS = ("schedule", "recompute", "flash_attention", "sequence_parallel")


@dataclass
class PlanDraft:
    """What a plan's base, bindings, uses and entries have contributed so far."""

    bindings: list[ir.Binding] = field(default_factory=list)
    modes: dict[ir.State, dict[str, ir.Mode]] = field(default_factory=dict)
    options: dict[ir.State, dict[str, object]] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)
    setting_src: dict[str, str] = field(default_factory=dict)  # setting -> strategy that set it
    overrides: list[ir.Override] = field(default_factory=list)
    bound: dict[str, Span] = field(default_factory=dict)  # mesh axis -> where it was bound
    mode_src: dict[tuple[ir.State, str], Span] = field(default_factory=dict)  # where a mode was placed
    schedule_axis: str | None = None
    unobserved: list[tuple[str, Span]] = field(default_factory=list)  # facts of the step the plan does not state
    optimizers: dict[str, object] = field(default_factory=dict)  # group -> ir.optimizers.Choice
    # id of an override taken from a strategy -> (where the plan binds or uses it, the strategy's name)
    override_sites: dict[int, tuple[Span, str]] = field(default_factory=dict)

    @classmethod
    def extending(cls, base: ir.Plan) -> "PlanDraft":
        """A draft that starts from everything the base plan holds."""
        draft = cls(bindings=list(base.bindings), overrides=list(base.overrides), unobserved=list(base.unobserved),
                    optimizers=dict(base.optimizers))
        for b in base.bindings:
            for a in b.axes:
                draft.bound[a] = b.span
        for pl in base.placements:
            draft.modes[pl.state] = dict(pl.modes)
            draft.options[pl.state] = {"unit": pl.unit, "prefetch": pl.prefetch,
                                       "reshard_after_forward": pl.reshard_after_forward,
                                       "residency": pl.residency}
        draft.settings = {"recompute": base.recompute, "flash_attention": base.flash_attention,
                          "sequence_parallel": base.sequence_parallel}
        if base.schedule is not None:
            s = base.schedule
            draft.settings["schedule"] = (s.kind, s.chunks, s.unit)
            draft.schedule_axis = s.axis
        return draft


class PlanAssembler:
    """Builds the plans of one spec over its mesh and model."""

    def __init__(self, vals: Values, expander: Expander, scope: ModuleScope, mesh: ir.Mesh, model: ir.Model):
        self.vals = vals
        self.cx = vals.cx
        self.expander = expander
        self.scope = scope
        self.mesh = mesh
        self.model = model

    def build(self, p: surface.PlanDef, stack: list[str]) -> ir.Plan | None:
        """The plan, or None after errors; ``stack``: the plans extending it, for cycles."""
        if p.name in stack:
            cycle = " -> ".join(stack[stack.index(p.name):] + [p.name])
            self.cx.error(Code.STRATEGY_CYCLE, f"plans extend each other in a cycle: {cycle}", p.span)
            return None
        axes = self.mesh.names
        mark = self.cx.mark()
        draft = PlanDraft()
        if p.extends is not None:
            base_name = p.extends.dotted
            base_syntax = self.vals.plans.get(base_name)
            if base_syntax is None:
                self.cx.error(Code.NOT_A_PLAN, f"'{base_name}' is not a plan", p.extends.span,
                              did_you_mean(base_name, self.vals.plans))
                return None
            base = self.build(base_syntax, stack + [p.name])
            if base is None:
                return None
            draft = PlanDraft.extending(base)
        placement_items = []
        for item in p.body:
            if isinstance(item, surface.Entry):
                if len(item.lhs) == 1 and item.lhs[0] in STATE_NAMES:
                    placement_items.append(item)
                    continue
                self._bind(draft, item)
            elif isinstance(item, surface.Use):
                self._use(draft, item)
            elif isinstance(item, surface.Prop):
                setting(self.vals, draft.settings, item, {}, PLAN_SETTINGS, "a plan")
            elif isinstance(item, surface.OverrideStmt):
                o = override(self.vals, item, {}, set(axes))
                if o is not None:
                    draft.overrides.append(o)
            elif isinstance(item, surface.Unobserved):
                if not item.text.strip():
                    self.cx.error(Code.BAD_PROPERTY_VALUE, "unobserved needs the fact it names, e.g. unobserved \"the loss "
                                  "normalisation\"", item.span)
                else:
                    draft.unobserved.append((item.text.strip(), item.span))
            elif isinstance(item, surface.SubBlock) and item.key == "optimizer":
                draft.optimizers.update(optimizer_section(self.vals, item, self.model))
            elif isinstance(item, surface.SubBlock):
                self.cx.error(Code.UNKNOWN_PROPERTY, f"a plan has no '{item.key}' section", item.span,
                              ("a plan's sections: optimizer { GROUP = ALGORITHM(...) }",))
        for item in placement_items:
            before = {s: dict(m) for s, m in draft.modes.items()}
            placement_entry(self.vals, draft.modes, draft.options, item, axes, {}, formal=False)
            draft.mode_src.update({(s, a): item.span for s, m in draft.modes.items() for a in m
                                   if before.get(s, {}).get(a) is not m[a] or s not in before})
        if self.cx.failed_since(mark):
            return None  # the errors already reported explain what is missing
        return self._finish(p, draft)

    def _finish(self, p: surface.PlanDef, draft: PlanDraft) -> ir.Plan | None:
        axes = self.mesh.names
        modes, options, settings = draft.modes, draft.options, draft.settings
        unbound = [a for a in axes if a not in draft.bound]
        if unbound:
            self.cx.error(Code.UNBOUND_AXIS, f"plan '{p.name}' binds no strategy to axis {', '.join(unbound)}", p.span,
                          ("bind every mesh axis, e.g. 'dp: ddp' for plain data parallelism",))
            return None
        if any(s not in modes or set(modes[s]) != set(axes) for s in ir.STATES):
            return None  # an error was reported where the placement broke
        for b in draft.bindings:
            differ = [s.value for s in ir.STATES if b.product and len({modes[s][a] for a in b.axes}) > 1]
            if differ:
                self.cx.error(Code.PRODUCT_BINDING, f"the axes of the product [{', '.join(b.axes)}] are placed differently "
                              f"({', '.join(differ)}): a product of axes acts as one axis", b.span,
                              tuple(f"{s}: " + ", ".join(f"{a} {modes[ir.State(s)][a].value}" for a in b.axes)
                                    for s in differ))
                return None
        placements = []
        for s in ir.STATES:
            o = options.get(s, {})
            placements.append(ir.Placement(
                state=s,
                modes=tuple((a, modes[s][a]) for a in axes),
                residency=o.get("residency", ir.Residency.DEVICE),
                unit=o.get("unit", "layer"),
                prefetch=o.get("prefetch", 1),
                reshard_after_forward=o.get("reshard_after_forward", True),
            ))
        schedule = None
        if "schedule" in settings:
            kind, v, u = settings["schedule"]
            pipeline_axes = [a for b in draft.bindings for a, r in b.roles if r is ir.Role.PIPELINE]
            axis = draft.schedule_axis or (pipeline_axes[0] if pipeline_axes else None)
            if axis is None:
                self.cx.error(Code.BAD_PROPERTY_VALUE, f"plan '{p.name}' has a pipeline schedule but no pipeline axis", p.span)
                return None
            schedule = ir.Schedule(kind, axis, v, u)
        plan = ir.Plan(
            name=p.name,
            mesh=self.mesh,
            model=self.model,
            bindings=tuple(draft.bindings),
            placements=tuple(placements),
            recompute=settings.get("recompute", ir.Recompute.NONE),
            flash_attention=settings.get("flash_attention", False),
            sequence_parallel=settings.get("sequence_parallel", False),
            schedule=schedule,
            overrides=tuple(draft.overrides),
            unobserved=tuple(draft.unobserved),
            span=p.span,
            optimizers=tuple(draft.optimizers.items()),
        )
        mark = self.cx.mark()
        check_optimizer_overrides(self.vals, plan, draft.override_sites)
        check_shapes(plan, self.vals, self.cx.error)
        for code, message, span, notes in routerstats.problems(plan, self.vals.values):  # the aux term's statistics (check.auxstats)
            self.cx.error(code, message, span, notes)
        for code, message, span, notes in capacity.problems(plan, self.vals.values):  # check.encode_capacity
            self.cx.error(code, message, span, notes)
        for code, message, span, notes in capdrop.problems(plan, self.vals.values):  # check.encode_capdrop
            self.cx.error(code, message, span, notes)
        for code, message, span, notes in router_stmt.problems(plan, self.vals.values):  # check.router
            self.cx.error(code, message, span, notes)
        for code, message, span, notes in (restated.problems(plan) + ulysses_split.too_many_heads(plan)  # PL291, heads
                                           + lossgather.problems(plan)):  # the loss on the gathered sequence
            self.cx.error(code, message, span, notes)
        if not self.cx.failed_since(mark):
            found = ill_typed(plan, lambda s, a: draft.mode_src.get((s, a), draft.bound.get(a, p.span)))
            self.cx.diags.extend(d for d in found if d not in self.cx.diags)  # a group's: once, not per plan
        return None if self.cx.failed_since(mark) else plan

    def _bind(self, draft: PlanDraft, item: surface.Entry) -> None:
        """Bind a strategy to mesh axes: ``dp: zero3``, ``(dp, tp): hybrid``."""
        error = self.cx.error
        axes = self.mesh.names
        ok = True
        for a in item.lhs:
            if a not in axes:
                if a in STATE_NAMES:
                    error(Code.BAD_PROPERTY_VALUE, f"state '{a}' cannot be bound together with axes", item.span)
                else:
                    notes = did_you_mean(a, tuple(axes) + STATE_NAMES)
                    error(Code.UNDEFINED_AXIS, f"'{a}' is neither a mesh axis nor a state", item.span,
                          notes or (f"mesh axes: {', '.join(axes)}",))
                ok = False
            elif a in draft.bound:
                error(Code.AXIS_REUSED, f"axis '{a}' is bound twice in one plan", item.span,
                      (f"first bound at line {draft.bound[a].line}",))
                ok = False
        if len(set(item.lhs)) != len(item.lhs):
            error(Code.AXIS_REUSED, "an axis appears twice in this binding", item.span)
            ok = False
        if not ok:
            return
        rhs = item.rhs
        if not isinstance(rhs, surface.StrategyRef):
            error(Code.NOT_A_STRATEGY, "an axis is bound to a strategy, not to a mode", rhs.span,
                  ("write e.g. 'dp: zero3', or place a state: 'params: {dp: S*}'",))
            return
        ref = surface.StrategyRef(rhs.path, item.options, rhs.span)
        found = lookup_strategy(ref, self.scope, self.cx)
        if found is None:
            return
        ex = self.expander.expand(found[0], found[1], ref.args, ref.span)
        if ex is None:
            return
        if not ex.placed:
            error(Code.AXIS_LESS_STRATEGY, f"strategy '{ref.dotted}' places no state; add it with 'use {ref.dotted}'",
                  item.span)
            return
        product = len(ex.axes) == 1 and len(item.lhs) > 1
        if len(ex.axes) != len(item.lhs) and not product:
            error(Code.ARITY_MISMATCH, f"strategy '{ref.dotted}' spans {len(ex.axes)} axes "
                  f"({', '.join(a for a in ex.axes if a != '_') or 'one'}) but is bound to {len(item.lhs)}",
                  item.span, ("a strategy over several axes is bound to as many axes, in the order of its 'over' "
                              "axes; a one-axis strategy to one axis or to a product of axes, [a, b]",))
            return
        if product and ex.roles[ex.axes[0]] is ir.Role.PIPELINE:
            error(Code.PRODUCT_BINDING, f"pipeline strategy '{ref.dotted}' is bound to a product of axes "
                  f"[{', '.join(item.lhs)}]: its schedule runs over one axis", item.span,
                  ("declare the pipeline stages as one mesh axis",))
            return
        for a in item.lhs:
            draft.bound[a] = item.span
        # formal axis -> the mesh axes it stands for (all of a product's)
        rename = {ex.axes[0]: tuple(item.lhs)} if product else {fa: (a,) for fa, a in zip(ex.axes, item.lhs)}
        for s, ms in ex.modes.items():
            for fa, m in ms.items():
                for a in rename[fa]:
                    draft.modes.setdefault(s, {})[a] = m
                    draft.mode_src[(s, a)] = item.span
        for s, opts in ex.options.items():
            draft.options.setdefault(s, {}).update(opts)
        self._merge_settings(draft, ex, item.span)
        taken = [rename_override(o, rename) for o in ex.overrides]
        draft.overrides.extend(taken)
        draft.override_sites.update((id(o), (item.span, ex.name)) for o in taken)
        draft.bindings.append(ir.Binding(ex.name, tuple(item.lhs),
                                         tuple((a, ex.roles[fa]) for fa in ex.axes for a in rename[fa]), item.span,
                                         product))
        pipeline = [rename[fa][0] for fa in ex.axes if ex.roles[fa] is ir.Role.PIPELINE]
        if pipeline and "schedule" in ex.settings:
            draft.schedule_axis = pipeline[0]

    def _merge_settings(self, draft: PlanDraft, ex: Expanded, span: Span) -> None:
        settings, src = draft.settings, draft.setting_src
        for key, value in ex.settings.items():
            if key in settings and settings[key] != value and key in src:
                self.cx.error(Code.CONFLICTING_SETTING, f"'{ex.name}' sets {key} differently from '{src[key]}'", span)
                continue
            settings[key] = value
            src[key] = ex.name

    def _use(self, draft: PlanDraft, item: surface.Use) -> None:
        """``use s``: take the settings and overrides of a strategy that places no state."""
        found = lookup_strategy(item.ref, self.scope, self.cx)
        if found is None:
            return
        ex = self.expander.expand(found[0], found[1], item.ref.args, item.ref.span)
        if ex is None:
            return
        if ex.placed:
            self.cx.error(Code.AXIS_LESS_STRATEGY, f"strategy '{item.ref.dotted}' places states; bind it to mesh axes "
                          "instead of 'use'", item.span)
            return
        self._merge_settings(draft, ex, item.span)
        draft.overrides.extend(ex.overrides)
        draft.override_sites.update((id(o), (item.span, ex.name)) for o in ex.overrides)
