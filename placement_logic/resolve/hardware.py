"""The hardware lines of the mesh block -> ``ir.Hardware``.

A mesh block may say which devices it holds and what its link classes are, beside its axes:

    mesh {
      device = h100_sxm                 # a catalogue device (placement_logic.hardware)
      precision = bf16                  # the peak FLOP/s the time model uses (default bf16)
      mfu = 0.45                        # time compute by one assumed MFU (default: kernel by kernel)
      overlap = true                    # data-parallel traffic hides behind compute (default)
      dp = 32 @ inter_node              # intra_node / inter_node: the device's own links
      tp = 8 @ intra_node
    }

``device = mygpu(memory = 24 GiB, flops = 165e12)`` is a device of one's own (``hbm = 2 TB``, its
HBM bandwidth in bytes per second, lets the kernel model time it);
``device = h100_sxm(memory = 94 GiB)`` a catalogue device with a figure changed. A line
naming a link class that an axis uses defines it: ``inter_node = ib_xdr`` (a catalogue
link) or ``inter_node = link(bandwidth = 25 GB, latency = 8e-6)`` (bytes per second per
direction, seconds per ring step).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from .. import hardware as hw
from .. import ir
from ..diagnostics import Code, did_you_mean
from ..frontend import surface
from .values import Values

SETTINGS = ("device", "precision", "mfu", "overlap")
DEVICE_ARGS = ("memory", "flops", "hbm", "matmul")
LINK_ARGS = ("bandwidth", "latency")


def is_hardware_line(decl: surface.AxisDecl, used_links: set[str]) -> bool:
    """A line of the mesh block that is a setting or defines a link class, not an axis."""
    return decl.link is None and (decl.name in SETTINGS or decl.name in used_links)


def build_hardware(lines: list[surface.AxisDecl], axes: list[ir.Axis], vals: Values,
                   span) -> ir.Hardware | None:
    """The hardware of the mesh, or None when the block says nothing of it (or after errors)."""
    if not lines:
        return None

    error = vals.cx.error
    mark = vals.cx.mark()
    by_name: dict[str, surface.AxisDecl] = {}
    for d in lines:
        if d.name in by_name:
            error(Code.DUPLICATE_AXIS, f"'{d.name}' is given twice in the mesh block", d.span,
                  (f"first given at line {by_name[d.name].span.line}",))
            continue
        by_name[d.name] = d
    dev_line = by_name.get("device")
    if dev_line is None:
        first = lines[0]
        error(Code.FILTER_ON_SHARDS, "the mesh's hardware needs its device: add e.g. 'device = h100_sxm'", first.span,
              ("catalogue devices: " + ", ".join(hw.DEVICES),))
        return None
    device = _device(dev_line.size, vals)
    precision, mfu, overlap = _settings(by_name, vals)
    if device is None or vals.cx.failed_since(mark):
        return None
    name, title, memory, flops_by_precision, hbm, matmul = device
    flops = flops_by_precision.get(precision)
    if flops is None:
        error(Code.FILTER_ON_SHARDS, f"{title} has no {precision} peak in the catalogue", by_name.get("precision", dev_line).span,
              (f"it has: {', '.join(flops_by_precision) or 'none'}; or give flops = ... with the device",))
        return None
    cat = hw.device(name)
    links = _links(by_name, axes, vals, cat, span)
    if vals.cx.failed_since(mark):
        return None
    eff = cat.efficiency if cat is not None else (hw.GENERIC_EFFICIENCY if hbm is not None else None)
    if eff is not None and matmul is not None:  # the user's measured best-shape matmul fraction
        eff = dataclasses.replace(eff, gemm=hw.gemm_table(matmul),
                                  sources=(f"matmul = {matmul}: the best-shape fraction given in the spec",) + eff.sources)
    return ir.Hardware(name, title, memory, flops, precision, mfu, tuple(links), overlap, dev_line.span,
                       hbm, eff, "mfu" in by_name, "precision" in by_name)


def _settings(by_name: dict[str, surface.AxisDecl], vals: Values) -> tuple[str, ir.Value, bool]:
    """The precision (default bf16), the assumed MFU (default 1/2) and whether traffic overlaps (default true)."""
    precision = "bf16"
    if "precision" in by_name:
        w = vals.word(by_name["precision"].size, hw.PRECISIONS, "'precision'")
        precision = w or precision
    mfu = ir.Const(Fraction(1, 2))
    if "mfu" in by_name:
        v = _number(by_name["mfu"].size, vals, "'mfu'", bytes_=False)
        if v is not None:
            if isinstance(v, ir.Const) and not 0 < v.value <= 1:
                vals.cx.error(Code.BAD_AXIS_SIZE, "'mfu' must lie in (0, 1]", by_name["mfu"].size.span)
            else:
                mfu = v
    overlap = True
    if "overlap" in by_name:
        e = by_name["overlap"].size
        if isinstance(e, surface.Bool):
            overlap = e.value
        else:
            vals.cx.error(Code.BAD_PROPERTY_VALUE, "'overlap' is true or false", e.span)
    return precision, mfu, overlap


def _links(by_name: dict[str, surface.AxisDecl], axes: list[ir.Axis], vals: Values, cat, span) -> list[ir.LinkClass]:
    """The link classes the axes use (defined in the block, from the catalogue, or the device's own),
    then the device's own links that no axis names."""
    links = []
    used = {a.link for a in axes if a.link}
    for ln in sorted(used):
        decl = by_name.get(ln)
        if decl is not None:
            k = _link(ln, decl.size, vals)
        elif hw.link(ln) is not None:
            k = _catalogue_link(ln, hw.link(ln), span)
        elif ln in hw.NODE_LINKS and cat is not None:
            own = cat.intra_link if ln == "intra_node" else cat.inter_link
            k = _catalogue_link(ln, hw.link(own), span)
        else:
            axis = next(a for a in axes if a.link == ln)
            vals.cx.error(Code.FILTER_ON_SHARDS, f"link class '{ln}' has no bandwidth: define it in the mesh block "
                          f"(e.g. '{ln} = ib_ndr' or '{ln} = link(bandwidth = 50 GB, latency = 5e-6)')", axis.span,
                          did_you_mean(ln, tuple(hw.LINKS) + hw.NODE_LINKS)
                          + ("catalogue links: " + ", ".join(hw.LINKS),))
            continue
        if k is not None:
            links.append(k)
    if cat is not None:  # the device's own links, for axes that name no link class
        for ln, own in (("intra_node", cat.intra_link), ("inter_node", cat.inter_link)):
            if ln not in used:
                links.append(_catalogue_link(ln, hw.link(own), span))
    return links


def _catalogue_link(name: str, k: hw.Link, span) -> ir.LinkClass:
    return ir.LinkClass(name, k.title if name == k.name else f"{k.name}: {k.title}",
                        ir.Const(k.bandwidth), ir.Const(k.latency), span, ir.Const(k.efficiency),
                        ir.Const(k.call_latency), None if k.step_latency is None else ir.Const(k.step_latency),
                        k.nccl, k.bus_curve)


def _kwargs(call: surface.Call, allowed: tuple[str, ...], vals: Values, what: str) -> dict | None:
    if call.args:
        vals.cx.error(Code.BAD_PROPERTY_VALUE, f"{what} takes named figures ({', '.join(a + ' = ...' for a in allowed)})",
                      call.args[0].span)
        return None
    out = {}
    for kw in call.kwargs:
        if kw.name not in allowed:
            vals.cx.error(Code.UNKNOWN_PROPERTY, f"{what} has no figure '{kw.name}'", kw.span, did_you_mean(kw.name, allowed))
            return None
        out[kw.name] = kw.value
    return out


def _device(e: surface.Expr, vals: Values):
    """(name, title, memory, {precision: flops}) of a device line, or None after an error."""

    error = vals.cx.error
    if isinstance(e, surface.Name):
        d = hw.device(e.id)
        if d is None:
            error(Code.FILTER_ON_SHARDS, f"'{e.id}' is not a device of the catalogue", e.span,
                  did_you_mean(e.id, tuple(hw.DEVICES)) + ("or give its figures: "
                                                           f"{e.id}(memory = 24 GiB, flops = 165e12)",))
            return None
        return d.name, d.title, ir.Const(Fraction(d.memory)), \
            {p: ir.Const(f) for p, f in d.flops.items()}, ir.Const(d.hbm_bandwidth), None
    if isinstance(e, surface.Call):
        d = hw.device(e.func)
        given = _kwargs(e, DEVICE_ARGS, vals, f"device '{e.func}'")
        if given is None:
            return None
        if d is None and not {"memory", "flops"} <= set(given):
            error(Code.FILTER_ON_SHARDS, f"'{e.func}' is not a device of the catalogue: give both its memory and its flops",
                  e.span, did_you_mean(e.func, tuple(hw.DEVICES)))
            return None
        memory = _number(given["memory"], vals, "'memory'", bytes_=True) if "memory" in given else None
        flops = _number(given["flops"], vals, "'flops'", bytes_=False) if "flops" in given else None
        hbm = _number(given["hbm"], vals, "'hbm'", bytes_=True) if "hbm" in given else None
        matmul = _number(given["matmul"], vals, "'matmul'", bytes_=False) if "matmul" in given else None
        if ("memory" in given and memory is None) or ("flops" in given and flops is None) or \
                ("hbm" in given and hbm is None) or ("matmul" in given and matmul is None):
            return None
        if matmul is not None:
            if not isinstance(matmul, ir.Const) or not 0 < matmul.value <= 1:
                error(Code.BAD_AXIS_SIZE, "'matmul' (the best-shape matmul FLOP/s over the peak) must be a number in (0, 1]",
                      given["matmul"].span)
                return None
            matmul = matmul.value
        for v, w in ((memory, "memory"), (flops, "flops"), (hbm, "hbm")):
            if isinstance(v, ir.Const) and v.value <= 0:
                error(Code.BAD_AXIS_SIZE, f"'{w}' must be positive", given[w].span)
                return None
        if d is None:
            return e.func, f"{e.func} (given figures)", memory, {p: flops for p in hw.PRECISIONS}, hbm, matmul
        peaks = {p: ir.Const(f) for p, f in d.flops.items()}
        if flops is not None:
            peaks = {p: flops for p in hw.PRECISIONS}
        return d.name, d.title + (" (figures changed)" if given else ""), \
            memory if memory is not None else ir.Const(Fraction(d.memory)), peaks, \
            hbm if hbm is not None else ir.Const(d.hbm_bandwidth), matmul
    error(Code.FILTER_ON_SHARDS, "'device' names a catalogue device or gives one's figures, e.g. device = h100_sxm", e.span,
          ("catalogue devices: " + ", ".join(hw.DEVICES),))
    return None


def _link(name: str, e: surface.Expr, vals: Values) -> ir.LinkClass | None:

    error = vals.cx.error
    if isinstance(e, surface.Name):
        k = hw.link(e.id)
        if k is None:
            error(Code.FILTER_ON_SHARDS, f"'{e.id}' is not a link of the catalogue", e.span,
                  did_you_mean(e.id, tuple(hw.LINKS)) + ("or give its figures: "
                                                         f"{name} = link(bandwidth = 50 GB, latency = 5e-6)",))
            return None
        return _catalogue_link(name, k, e.span)
    if isinstance(e, surface.Call):
        base = hw.link(e.func)
        if base is None and e.func != "link":
            error(Code.FILTER_ON_SHARDS, f"'{e.func}' is not a link of the catalogue", e.span,
                  did_you_mean(e.func, tuple(hw.LINKS) + ("link",)))
            return None
        given = _kwargs(e, LINK_ARGS, vals, f"link '{name}'")
        if given is None:
            return None
        if base is None and set(given) != set(LINK_ARGS):
            error(Code.FILTER_ON_SHARDS, f"link '{name}' needs its bandwidth and its latency", e.span)
            return None
        bw = _number(given["bandwidth"], vals, "'bandwidth'", bytes_=True) if "bandwidth" in given else None
        lat = _number(given["latency"], vals, "'latency'", bytes_=False) if "latency" in given else None
        if ("bandwidth" in given and bw is None) or ("latency" in given and lat is None):
            return None
        if isinstance(bw, ir.Const) and bw.value <= 0:
            error(Code.BAD_AXIS_SIZE, "'bandwidth' must be positive", given["bandwidth"].span)
            return None
        if isinstance(lat, ir.Const) and lat.value < 0:
            error(Code.BAD_AXIS_SIZE, "'latency' must not be negative", given["latency"].span)
            return None
        title = "given figures" if base is None else f"{base.name} (figures changed)"
        return ir.LinkClass(name, title, bw if bw is not None else ir.Const(base.bandwidth),
                            lat if lat is not None else ir.Const(base.latency), e.span,
                            ir.Const(base.efficiency if base is not None and bw is None else Fraction(1)),
                            *_nccl_latency(base if lat is None else None),
                            base.nccl if base is not None and lat is None else None,
                            base.bus_curve if base is not None and bw is None else ())
    error(Code.FILTER_ON_SHARDS, f"link class '{name}' is a catalogue link or link(bandwidth = ..., latency = ...)", e.span)
    return None


def _nccl_latency(base: hw.Link | None) -> tuple:
    """A catalogue link's NCCL latencies, kept while its latency is not given."""
    if base is None:
        return ir.Const(Fraction(0)), None
    return ir.Const(base.call_latency), None if base.step_latency is None else ir.Const(base.step_latency)


def _number(e: surface.Expr, vals: Values, what: str, bytes_: bool) -> ir.Value | None:
    r = vals.expr(e, {})
    if r is None:
        return None
    if bytes_ and r[1] is not ir.Dim.BYTES:
        vals.cx.error(Code.BAD_PROPERTY_VALUE, f"{what} needs bytes, e.g. 80 GiB (bandwidth: bytes per second)", e.span)
        return None
    if not bytes_ and r[1] is ir.Dim.BYTES:
        vals.cx.error(Code.UNIT_NOT_ALLOWED, f"{what} is a plain number; a byte unit does not fit here", e.span)
        return None
    return r[0]
