# areal-rs: how a stdin program's code is compiled, in the guest harness (harness.py) and in
# `areal bench sandbox`'s native baseline alike.
#
# A stdin program is a module: its variables are globals, looked up by name in a dict at every
# use. LiveCodeBench's grader wraps the program in a function, where they are fast locals
# (a loop over 10^7 numbers takes half the time), but that breaks programs that declare
# `global x` (docs/sandbox.md). Here the program's statements become a function's body only
# when nothing the program can observe changes but its speed; otherwise it runs as written.
#
# It runs as written when it:
#   - declares `global` anywhere, or makes a comprehension's `:=` bind a module name;
#   - mentions what reads a scope by name or shows where code was defined (`globals`,
#     `locals`, `vars`, `dir`, `eval`, `exec`, frames, `__qualname__`, pickle, ...);
#   - annotates a module-level variable (a module evaluates the annotation, a function not);
#   - has a class body that assigns a module-level name and also reads it (a class body
#     reads such a name from the module's globals, never from an enclosing function);
#   - binds a name it could also read from the prelude or the builtins (`S`, `M`, `input`,
#     `e`) without binding it first: the first top-level statement that mentions the name
#     must bind it unconditionally (`N, M = ...`, `def input(): ...`, `import x as S`), and
#     no `del` or `except ... as` may unbind it later;
#   - does not compile as a function (a star import, `from __future__`, an empty program).
# A module that does not compile raises here exactly as `compile` does. Functions and classes
# keep the qualified names they have in a module (`P`, not `<wrapper>.<locals>.P`).
import ast
import builtins as _builtins
import symtable
import types
import warnings

_INTROSPECTION = frozenset(
    {"globals", "locals", "vars", "dir", "eval", "exec", "breakpoint", "__main__",
     "__annotations__", "__builtins__", "pickle", "_pickle", "copyreg", "shelve",
     "marshal", "multiprocessing", "inspect", "traceback"}
)
# Attributes with the same powers, found in the text (a false match only costs speed).
_INTROSPECTION_TEXT = ("_getframe", "f_globals", "f_locals", "f_back", "modules",
                       "__qualname__", "__code__", "__globals__", "__closure__")
_WRAPPER = "_areal_program"
_PREFIX = _WRAPPER + ".<locals>."
_CO_OPTIMIZED = 0x1
_CO_SUSPENDS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, async generator
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _own_statements(body):
    """The statements that run in the module's own scope (blocks included, bodies of the
    functions and classes it defines not)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, _DEFS):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _own_statements(getattr(stmt, field, ()))
        for handler in getattr(stmt, "handlers", ()):
            yield from _own_statements(handler.body)
        for case in getattr(stmt, "cases", ()):
            yield from _own_statements(case.body)


def _names(node):
    """Every name `node` mentions, in any role and any scope."""
    names = set()
    for n in ast.walk(node):
        t = type(n)
        if t is ast.Name:
            names.add(n.id)
        elif t is ast.alias:
            names.add(n.asname or n.name.partition(".")[0])
        elif t is ast.arg:
            names.add(n.arg)
        elif t in _DEFS or t is ast.ExceptHandler or t is ast.MatchAs or t is ast.MatchStar:
            if n.name:
                names.add(n.name)
        elif t is ast.MatchMapping and n.rest:
            names.add(n.rest)
    return names


def _heads(stmt):
    """What a `def` or `class` statement evaluates where it stands."""
    heads = list(stmt.decorator_list)
    if type(stmt) is ast.ClassDef:
        return heads + stmt.bases + [k.value for k in stmt.keywords]
    a = stmt.args
    heads += a.defaults + [d for d in a.kw_defaults if d is not None]
    heads += [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs if x.annotation]
    heads += [x.annotation for x in (a.vararg, a.kwarg) if x and x.annotation]
    return heads + ([stmt.returns] if stmt.returns else [])


def _binds_first(stmt, name):
    """Whether `stmt`, a top-level statement that mentions `name`, binds it before anything
    in it can read it."""
    t = type(stmt)
    if t is ast.Assign:
        if name in _names(stmt.value):
            return False
        for target in stmt.targets:
            elts = [target] if type(target) is ast.Name else getattr(target, "elts", [target])
            for e in elts:
                e = e.value if type(e) is ast.Starred else e
                if type(e) is not ast.Name and name in _names(e):
                    return False
        return True
    if t in _DEFS:
        return stmt.name == name and not any(name in _names(h) for h in _heads(stmt))
    return t is ast.Import or t is ast.ImportFrom


def _as_function(source, filename, tree, known):
    """The program's statements compiled as a function's body, or None where that could
    change what the program does."""
    if not tree.body or any(word in source for word in _INTROSPECTION_TEXT):
        return None
    # What a module may not do but a function may: compiled as a module, it raises.
    if any(type(stmt) is ast.Return for stmt in _own_statements(tree.body)):
        return None
    top = symtable.symtable(source, filename, "exec")
    bound = set()
    for s in top.get_symbols():
        if s.is_annotated():
            return None
        if s.is_assigned() or s.is_imported() or s.is_namespace():
            bound.add(s.get_name())
    scopes = [top]
    while scopes:
        scope = scopes.pop()
        scopes.extend(scope.get_children())
        is_class = scope.get_type() == "class"
        for s in scope.get_symbols():
            name = s.get_name()
            if name in _INTROSPECTION or s.is_declared_global():
                return None
            if is_class and name in bound and s.is_assigned() and s.is_referenced():
                return None
    shadowing = bound & known
    if shadowing:
        for stmt in _own_statements(tree.body):
            if type(stmt) is ast.Delete and any(
                type(x) is ast.Name and x.id in shadowing for x in stmt.targets
            ):
                return None
            if any(h.name in shadowing for h in getattr(stmt, "handlers", ())):
                return None
        left = set(shadowing)
        for stmt in tree.body:
            hit = left & _names(stmt)
            if any(not _binds_first(stmt, name) for name in hit):
                return None
            left -= hit
            if not left:
                break
    wrapper = ast.FunctionDef(
        _WRAPPER, ast.arguments([], [], None, [], [], None, []), tree.body, [], None, None,
        lineno=1, col_offset=0, end_lineno=1, end_col_offset=0,
    )
    module = compile(ast.Module([wrapper], []), filename, "exec")
    inner = next(c for c in module.co_consts if type(c) is types.CodeType)
    if inner.co_flags & _CO_SUSPENDS:  # `yield` or `await` at the top
        return None
    return _unnest(inner).replace(co_name="<module>", co_qualname="<module>")


def _unnest(code):
    """`code` with what it defines named as a module would name it."""
    consts = []
    for c in code.co_consts:
        if type(c) is types.CodeType:
            c = _unnest(c)
            if c.co_qualname.startswith(_PREFIX):
                c = c.replace(co_qualname=c.co_qualname[len(_PREFIX):])
        consts.append(c)
    if not code.co_flags & _CO_OPTIMIZED:
        # A class body sets its `__qualname__` from a constant: its own qualified name.
        consts = [
            c[len(_PREFIX):] if type(c) is str and c == code.co_qualname else c for c in consts
        ]
    return code.replace(co_consts=tuple(consts))


def known_names(g):
    """What a program run in the globals `g` can read without binding it."""
    return frozenset(g) | frozenset(dir(_builtins))


def compile_program(source, filename, known):
    """A stdin program, ready for `run_program`: its statements as a function's body where
    that changes nothing but speed (see above), else the module as written. `known`: what
    `known_names` says of the globals it will run in. Raises what `compile` raises, and
    warns (a SyntaxWarning) what compiling the text warns, once."""
    with warnings.catch_warnings(record=True) as warned:
        try:
            code = _as_function(source, filename, ast.parse(source, filename), known)
        except Exception:
            code = None
    if code is None:
        # As written: what does not compile raises exactly as compiling the text raises it
        # (and what the attempt above warned is warned again here, by `compile` itself).
        return compile(source, filename, "exec"), False
    for w in warned:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
    return code, True


def run_program(program, g):
    """Run what `compile_program` gave in the globals `g`."""
    code, as_function = program
    if as_function:
        types.FunctionType(code, g)()
    else:
        exec(code, g)
