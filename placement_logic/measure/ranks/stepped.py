"""An optimizer update after every microbatch for some parameter groups only (torch):
``override optimizer[G]: step_every_microbatch`` with G a group of the tiny model's parameters.

The parameters of the stepped groups get an optimizer of their own, stepped (and their
gradients cleared) after every microbatch's backward; the others' optimizer steps once, at
the end of the step, as every optimizer does. Each parameter's group is read from its name in
the tiny model (ranks/model.py) as ir/groups.py lays out a dense transformer's groups.
"""

from __future__ import annotations

# the harness's group names for each override group (``matrices``: every weight matrix group the
# tiny model has; the fused q/k/v projection holds the attention and kv groups' rows together)
EXPANDS = {"matrices": {"qkv", "attention", "mlp"}, "mlp": {"mlp"}, "norms": {"norms"},
           "final_norm": {"final_norm"}, "biases": {"biases"}, "embedding": {"embedding"}, "head": {"head"}}


def group_of(name: str) -> str:
    """The parameter group of a dense tiny-model parameter (ir/groups.py): ``qkv`` for the fused
    projection; a name outside the dense layout is an error, never a guess."""
    parts = name.split(".")
    if name == "embed.weight":
        return "embedding"
    if name == "head.weight":
        return "head"
    if parts[0] == "norm":
        return "final_norm"
    if parts[0] == "blocks" and len(parts) >= 4:
        module, leaf = ".".join(parts[2:-1]), parts[-1]
        if module in ("norm1", "norm2"):
            return "norms"
        if module == "attn.qkv":
            return "qkv"
        if module in ("attn.proj", "mlp.fc2") and leaf == "bias":
            return "biases"
        if module == "attn.proj":
            return "attention"
        if module in ("mlp.fc1", "mlp.fc2"):
            return "mlp"
    raise ValueError(f"parameter {name} is not one of a dense transformer's groups")


def stepped(named, groups: tuple[str, ...]) -> tuple[list, list]:
    """(the parameters of ``groups``, the others), ``named`` as (name, parameter) pairs."""
    want = set().union(*(EXPANDS[g] for g in groups))
    each = [p for n, p in named if group_of(n) in want]
    return each, [p for n, p in named if group_of(n) not in want]


class SplitOptimizer:
    """Two optimizers: ``each`` over the stepped groups (also stepped after every microbatch,
    ``worker``'s ``after_microstep``), ``rest`` over the others; the step runs both."""

    def __init__(self, each, rest) -> None:
        self.each, self.rest = each, rest
        self.param_groups = each.param_groups + (rest.param_groups if rest is not None else [])

    @property
    def state(self) -> dict:
        parts = (("each", self.each), ("rest", self.rest))
        return {(w, k): v for w, o in parts if o is not None for k, v in o.state.items()}

    def step(self) -> None:
        self.each.step()
        if self.rest is not None:
            self.rest.step()

    def zero_grad(self) -> None:
        self.each.zero_grad()
        if self.rest is not None:
            self.rest.zero_grad()
