"""Check a vLLM source tree against what the plugin expects: `python3 check_vllm.py <vllm checkout> [<rev>...]`.

vLLM cannot run here, and its internals move, so this reads vLLM's source as text (Python's ast, nothing
imported) and answers, for each revision given (or the working tree when none is): would the plugin patch each
target (the same check ``install`` makes, run on functions of the same signatures), and does vLLM still have the
attributes and fields the plugin reads? A maintainer runs it when vLLM moves, then adds the row to the README's
table of checked commits. Exit status 1 when an essential target would be refused.
"""

import ast
import subprocess
import sys

import otelcol_llm_vllm as plugin

OUTPUT_PROCESSOR = "vllm/v1/engine/output_processor.py"
ENGINE = "vllm/v1/engine/__init__.py"
# What the Observer reads of a RequestState (set in __init__) and of an EngineCoreRequest (its fields).
STATE_ATTRIBUTES = ("request_id", "external_req_id", "parent_req", "request_index", "output_kind", "prompt_len",
                    "detokenizer", "stats", "streaming_input")
REQUEST_FIELDS = ("request_id", "sampling_params", "arrival_time", "trace_headers", "resumable", "session_id")


def source(tree, rev, path):
    if rev is None:
        with open("%s/%s" % (tree, path), encoding="utf-8") as f:
            return f.read()
    return subprocess.run(["git", "-C", tree, "show", "%s:%s" % (rev, path)], check=True, capture_output=True,
                          text=True).stdout


def classes(src):
    return {n.name: n for n in ast.parse(src).body if isinstance(n, ast.ClassDef)}


def stub(func):
    """A function with the signature of ``func`` (an ast.FunctionDef); defaults stand in as None."""
    args = func.args
    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None  # they name vLLM's types
    node = ast.FunctionDef(name=func.name, args=ast.arguments(
        posonlyargs=args.posonlyargs, args=args.args, vararg=args.vararg, kwonlyargs=args.kwonlyargs,
        kw_defaults=[None if d is None else ast.Constant(None) for d in args.kw_defaults], kwarg=args.kwarg,
        defaults=[ast.Constant(None) for _ in args.defaults]), body=[ast.Pass()], decorator_list=[], returns=None)
    ns = {}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])), "<stub>", "exec"), ns)
    return ns[func.name], func.decorator_list


def check(tree, rev):
    found = classes(source(tree, rev, OUTPUT_PROCESSOR))
    rows, ok = [], True
    for t in plugin.TARGETS:
        cls = found.get(t.cls)
        funcs = {f.name: f for f in (cls.body if cls else []) if isinstance(f, ast.FunctionDef)}
        if t.method not in funcs:
            why = "class missing" if cls is None else "method missing"
        else:
            fn, decorators = stub(funcs[t.method])
            ns = {t.method: staticmethod(fn) if any(getattr(d, "id", "") == "staticmethod" for d in decorators)
                  else fn}
            why = None
        if why is None:
            res, why = plugin._check(type(t.cls, (), ns), t)
        rows.append("%s: %s" % (t.name, "patched" if why is None else "REFUSED (%s)" % why))
        ok = ok and (why is None or not t.essential)
    state = found.get("RequestState")
    init = next((f for f in (state.body if state else []) if isinstance(f, ast.FunctionDef)
                 and f.name == "__init__"), None)
    assigned = {n.attr for n in ast.walk(init) if isinstance(n, ast.Attribute)} if init else set()
    missing = [a for a in STATE_ATTRIBUTES if a not in assigned]
    rows.append("RequestState attributes read: %s" % ("all there" if not missing else "missing " + ", ".join(missing)))
    req = classes(source(tree, rev, ENGINE)).get("EngineCoreRequest")
    fields = {n.target.id for n in (req.body if req else []) if isinstance(n, ast.AnnAssign)}
    missing = [f for f in REQUEST_FIELDS if f not in fields]
    rows.append("EngineCoreRequest fields read: %s" % ("all there" if not missing else "missing " + ", ".join(missing)))
    return rows, ok


def main(argv):
    if not argv:
        print(__doc__.strip().splitlines()[0])
        return 2
    tree, revs = argv[0], argv[1:] or [None]
    status = 0
    for rev in revs:
        rows, ok = check(tree, rev)
        print("== %s" % (rev or tree))
        for r in rows:
            print("  " + r)
        status = status or (0 if ok else 1)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
