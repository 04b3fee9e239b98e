"""Loading: a file path or a string -> checked ``ir.Spec``.

Reads the source, parses it, loads imported modules (``std.<name>`` from the library
shipped in ``placement_logic/stdlib``, other dotted names as ``.place`` files relative to
the importing file), and resolves. Errors from every stage are raised as one
``DiagnosticError`` that also carries the source text of each file for snippets.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..resolve import ModuleScope, collect_scope, resolve_module
from . import surface
from .files import normalise_text, packaged, read_regular, read_source  # noqa: F401 - read_source re-exported
from .parser import parse, parse_pieces

STD = "std"


@lru_cache(maxsize=1)
def library_modules() -> dict[str, str]:
    """Library module name -> source text, for every ``.place`` file in the stdlib (read once
    per process: the package's own files; a spec's every import asked for them again)."""
    root = packaged("stdlib")
    return {
        entry.name[: -len(".place")]: entry.read_text(encoding="utf-8")
        for entry in root.iterdir()
        if entry.name.endswith(".place")
    }


@lru_cache(maxsize=1)
def library_index() -> dict[str, tuple[str, ...]]:
    """Library module name -> names of the strategies it defines."""
    index = {}
    for name, text in sorted(library_modules().items()):
        module = parse(text, f"<std.{name}>")
        index[name] = tuple(i.name for i in module.items if isinstance(i, surface.StrategyDef))
    return index


@lru_cache(maxsize=64)
def _parse_library(text: str, file: str):
    """A library module's syntax tree: parsed once per process (the trees are immutable)."""
    return parse(text, file)


def library_path(name: str) -> str:
    return f"<std.{name}>"


class Loader:
    """Loads modules for one resolution; caches them and detects import cycles."""

    def __init__(self, base_dir: Path | None):
        self.base_dir = base_dir
        self.cache: dict[tuple[str, ...], ModuleScope] = {}
        self.loading: list[tuple[str, ...]] = []
        self.sources: dict[str, str] = {}
        self.diags: list[Diagnostic] = []

    def error(self, code, message, span, notes=()):
        self.diags.append(Diagnostic(code, message, span, notes=tuple(notes)))

    def __call__(self, path: tuple[str, ...], span: Span) -> ModuleScope | None:
        if path in self.cache:
            return self.cache[path]
        if path in self.loading:
            cycle = " -> ".join(".".join(p) for p in self.loading[self.loading.index(path):] + [path])
            self.error(Code.IMPORT_CYCLE, f"modules import each other in a cycle: {cycle}", span)
            return None
        text, file = self._source(path, span)
        if text is None:
            return None
        self.loading.append(path)
        try:
            try:
                module = _parse_library(text, file) if path[0] == STD else parse(text, file)
            except DiagnosticError as exc:
                self.diags.extend(exc.diagnostics)
                return None
            scope = ModuleScope(".".join(path), source=text)
            collect_scope(scope, module, self, self.error)
            self.cache[path] = scope
            return scope
        finally:
            self.loading.pop()

    def _source(self, path: tuple[str, ...], span: Span) -> tuple[str | None, str]:
        if path[0] == STD:
            libs = library_modules()
            if len(path) != 2 or path[1] not in libs:
                from ..diagnostics import did_you_mean

                name = ".".join(path)
                self.error(Code.UNKNOWN_MODULE, f"no library module '{name}'", span,
                           did_you_mean(name, [f"std.{m}" for m in libs]) or
                           (f"library modules: {', '.join('std.' + m for m in sorted(libs))}",))
                return None, ""
            file = library_path(path[1])
            text = libs[path[1]]
        else:
            base = self.base_dir or Path.cwd()
            target = base.joinpath(*path[:-1], path[-1] + ".place")
            file = str(target)
            try:
                text = normalise_text(read_regular(target).decode("utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                self.error(Code.UNKNOWN_MODULE, f"cannot import '{'.'.join(path)}': no readable file {target}", span)
                return None, ""
        self.sources[file] = text
        return text, file


def load_string(text: str, file: str = "<string>", base_dir: Path | None = None, shared: bool = False) -> ir.Spec:
    """Parse and resolve one spec given as text; ``shared``: its top-level pieces parsed once
    per process (``parser.parse_pieces``; for the many specs that share a model block)."""
    return load_with_sources(text, file, base_dir, shared)[0]


def load_with_sources(text: str, file: str = "<string>", base_dir: Path | None = None, shared: bool = False
                      ) -> tuple[ir.Spec, dict[str, str]]:
    """The spec and the text of every module it was resolved from (its own and its imports'),
    by file name: what a result derived from the spec depends on."""
    text = normalise_text(text)
    loader = Loader(base_dir)
    loader.sources[file] = text
    try:
        module = (parse_pieces if shared else parse)(text, file)
        spec = resolve_module(module, loader, library_index, base_dir=base_dir)
    except DiagnosticError as exc:
        diags = list(loader.diags) + [d for d in exc.diagnostics if d not in loader.diags]
        raise DiagnosticError(diags, {**loader.sources, **exc.sources}) from None
    if loader.diags:
        raise DiagnosticError(loader.diags, loader.sources)
    return spec, {**loader.sources, **dict(spec.inputs)}


def load_spec(path: str | Path) -> ir.Spec:
    """Read, parse and resolve the spec in a file."""
    text = read_source(path)
    return load_string(text, str(path), Path(path).resolve().parent)
