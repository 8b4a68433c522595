"""Compile parsed rules (with their includes) into a :class:`RuleSet`.

Includes are spliced in where they stand: ``Rule.order`` numbers the rules of the whole set
in reading order (an included file's rules come before the statements after its
``include``). Resolution: relative to the including file's folder (or ``base`` for text),
then the shipped library; cycles and missing files are errors at the ``include``.

Precedence (documented for users in ``docs/rules.md``):

* group and flat rules, per module call: the matching rule with the highest ``priority``
  wins; on equal priority the rule with the highest ``order`` (written last) wins;
* tag rules run in order of (``priority``, ``order``): later ones see earlier tags and
  overwrite the same key;
* one ``split`` per rule set;
* the last ``on cycle`` statement sets the cycle policy (default ``error``), so a file can
  override the policy of a file it includes.

Each rule carries its selector twice: ``predicate`` over one :class:`Facts` (the reference)
and ``mask`` over many subjects at once (what grouping uses).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from attrs import field, frozen

from rewrite.compile import templates
from rewrite.compile.selectors import Mask, Predicate, compile_mask, compile_selector
from rewrite.errors import Diagnostic, RuleError
from rewrite.lang import ast, parse_text
from rewrite.lang.source import Span, decode


@frozen
class Rule:
    """A compiled group, flat or tag rule."""

    kind: str
    """``group``, ``flat`` or ``tag``."""
    predicate: Predicate = field(repr=False, eq=False)
    span: Span = field(eq=False)
    order: int
    """Position among all rules after includes are resolved."""
    priority: int = 0
    name_template: str = templates.DEFAULT_NAME
    domain_template: str = templates.DEFAULT_DOMAIN
    assignments: tuple[tuple[str, str], ...] = ()
    selector: ast.Selector | None = field(default=None, repr=False, eq=False)
    mask: Mask | None = field(default=None, repr=False, eq=False)
    """The selector over many subjects at once (see :func:`compile_mask`)."""

    @property
    def origin(self) -> str:
        """``file:line`` of the rule, as shown in ``explain`` and ONNX metadata."""
        return f"{self.span.source.name}:{self.span.line}"


@frozen
class Split:
    """The split action: components per value of tag ``key``."""

    key: str
    order: tuple[str, ...]
    span: Span = field(eq=False)

    @property
    def origin(self) -> str:
        return f"{self.span.source.name}:{self.span.line}"


@frozen
class CyclePolicy:
    """What to do with a group that cannot be outlined: ``error`` or ``flatten``."""

    action: str
    span: Span | None = field(default=None, eq=False)
    """The ``on cycle`` statement (None: the default)."""

    @property
    def flatten(self) -> bool:
        return self.action == "flatten"


@frozen
class RuleSet:
    """Compiled rules, ready to match a graph."""

    rules: tuple[Rule, ...]
    split: Split | None = None
    files: tuple[str, ...] = ()
    on_cycle: CyclePolicy = CyclePolicy("error")
    """The last ``on cycle`` statement (default: ``error``)."""

    @property
    def group_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind in ("group", "flat"))

    @property
    def tag_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind == "tag")


def _library_file(name: str) -> Path | None:
    candidate = resources.files("rewrite.library").joinpath(name)
    try:
        if candidate.is_file():
            return Path(str(candidate))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return None


def _resolve_include(include: ast.Include, base: Path | None) -> Path:
    """Relative to the including file's folder, then the shipped rule library."""
    path = Path(include.path)
    tried = []
    if path.is_absolute():
        tried.append(path)
    else:
        tried.append((base or Path.cwd()) / path)
        library = _library_file(include.path)
        if library is not None:
            tried.append(library)
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise RuleError(
        [Diagnostic("error", f"cannot include {include.path!r}: no such rules file", include.span)]
    )


class _Compiler:
    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self.split: Split | None = None
        self.on_cycle = CyclePolicy("error")
        self.files: list[str] = []
        self._stack: list[Path] = []

    def ruleset(self) -> RuleSet:
        return RuleSet(tuple(self.rules), self.split, tuple(self.files), self.on_cycle)

    def add_file(self, parsed: ast.RulesFile, base: Path | None, path: Path | None) -> None:
        if path is not None:
            self._stack.append(path.resolve())
            self.files.append(str(path))
        try:
            for statement in parsed.statements:
                self._statement(statement, base)
        finally:
            if path is not None:
                self._stack.pop()

    def _statement(self, s: ast.Statement, base: Path | None) -> None:
        if isinstance(s, ast.Include):
            target = _resolve_include(s, base)
            if target.resolve() in self._stack:
                raise RuleError([Diagnostic("error", f"include cycle through {s.path!r}", s.span)])
            parsed = parse_text(_read(target, s.span), _display(target))
            self.add_file(parsed, target.parent, target)
        elif isinstance(s, ast.GroupRule):
            name = templates.check_template(s.name or templates.DEFAULT_NAME, s.name_span or s.span)
            domain = templates.check_template(
                s.domain or templates.DEFAULT_DOMAIN, s.domain_span or s.span
            )
            self._add("group", s, name_template=name, domain_template=domain)
        elif isinstance(s, ast.FlatRule):
            self._add("flat", s)
        elif isinstance(s, ast.TagRule):
            self._add("tag", s, assignments=tuple((a.key, a.value) for a in s.assignments))
        elif isinstance(s, ast.SplitRule):
            if self.split is not None:
                raise RuleError([
                    Diagnostic("error", "a rule set has at most one split", s.span,
                               f"the first split is at {self.split.span.location}")
                ])
            self.split = Split(s.key, s.order, s.span)
        elif isinstance(s, ast.CyclePolicy):
            self.on_cycle = CyclePolicy(s.action, s.span)

    def _add(self, kind: str, s: ast.GroupRule | ast.FlatRule | ast.TagRule, **options) -> None:
        self.rules.append(Rule(
            kind, compile_selector(s.selector), s.span, len(self.rules), s.priority,
            selector=s.selector, mask=compile_mask(s.selector), **options,
        ))


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _read(path: Path, span: Span | None = None) -> str:
    """The text of a rules file. A file that cannot be read is an error at ``span`` (the
    ``include``) when given; bytes that are not UTF-8, an error at the first of them."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RuleError([Diagnostic("error", f"{path}: cannot read: {e.strerror}", span)]) from None
    return decode(data, _display(path))


def parse_rules(text: str, name: str = "<string>", *, base: str | Path | None = None) -> RuleSet:
    """Compile rules text; ``include`` paths resolve against ``base`` (default: cwd)."""
    compiler = _Compiler()
    compiler.add_file(parse_text(text, name), Path(base) if base else None, None)
    return compiler.ruleset()


def shipped_rules(name: str) -> Path | None:
    """The shipped rules file ``name`` (``"llama"``: ``llama.rules``), or None."""
    return _library_file(f"{name}.rules") if name.isidentifier() else None


def load_rules(path: str | Path) -> RuleSet:
    """Compile a ``.rules`` file. A bare name like ``"gpt2"`` finds a shipped rule file."""
    path = Path(path)
    if not path.exists():
        library = _library_file(path.name if path.suffix else f"{path.name}.rules")
        if library is not None and len(path.parts) == 1:
            path = library
        else:
            raise RuleError([Diagnostic("error", f"{path}: no such rules file")])
    if path.is_dir():
        raise RuleError([Diagnostic("error", f"{path}: is a directory, expected a .rules file")])
    compiler = _Compiler()
    compiler.add_file(parse_text(_read(path), _display(path)), path.parent, path)
    return compiler.ruleset()
