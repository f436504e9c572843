"""Check a vLLM source tree against what the plugin expects: `python3 check_vllm.py <vllm checkout> [<rev>...]`.

vLLM cannot run here, and its internals move, so this reads vLLM's source as text (Python's ast, nothing
imported) and answers, for each revision given (or the working tree when none is): would the plugin patch each
target (the same check ``install`` makes, run on functions of the same signatures), and does vLLM still have the
attributes and fields the plugin reads? A maintainer runs it when vLLM moves, then adds the row to the README's
table of checked commits. Exit status 1 when an essential target would be refused, or the engine core's half
(otelcol_llm_vllm_steps) would be off: a scheduler target refused, something it reads missing, or an engine core
that does not load the plugins.
"""

import ast
import subprocess
import sys

import otelcol_llm_vllm as plugin
import otelcol_llm_vllm_patching as patching
import otelcol_llm_vllm_steps as steps

OUTPUT_PROCESSOR = "vllm/v1/engine/output_processor.py"
ENGINE = "vllm/v1/engine/__init__.py"
# What the Observer reads of a RequestState (set in __init__) and of an EngineCoreRequest (its fields).
STATE_ATTRIBUTES = ("request_id", "external_req_id", "parent_req", "request_index", "output_kind", "prompt_len",
                    "detokenizer", "stats", "streaming_input")
REQUEST_FIELDS = ("request_id", "sampling_params", "arrival_time", "trace_headers", "resumable", "session_id")
# The engine core's half (otelcol_llm_vllm_steps): the scheduler it wraps, what it reads of the Scheduler (set in
# __init__), of a SchedulerOutput (its fields) and of a Request (set in __init__), and the call that loads the
# plugins in the engine core's process.
SCHEDULER = "vllm/v1/core/sched/scheduler.py"
SCHEDULER_OUTPUT = "vllm/v1/core/sched/output.py"
REQUEST = "vllm/v1/request.py"
ENGINE_CORE = "vllm/v1/engine/core.py"
SCHEDULER_ATTRIBUTES = ("requests", "finished_req_ids")
SCHEDULER_OUTPUT_FIELDS = ("num_scheduled_tokens", "finished_req_ids")
SCHEDULER_REQUEST_ATTRIBUTES = ("request_id", "num_prompt_tokens", "num_computed_tokens")


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


def init_attributes(cls):
    """The attributes a class's __init__ sets on self."""
    init = next((f for f in (cls.body if cls else []) if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
                None)
    return {n.attr for n in ast.walk(init) if isinstance(n, ast.Attribute)} if init else set()


def check_targets(found, targets):
    rows, ok = [], True
    for t in targets:
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
            res, why = patching.check(type(t.cls, (), ns), t)
        rows.append("%s: %s" % (t.name, "patched" if why is None else "REFUSED (%s)" % why))
        ok = ok and (why is None or not t.essential)
    return rows, ok


def missing_row(what, wanted, have):
    missing = [a for a in wanted if a not in have]
    return "%s: %s" % (what, "all there" if not missing else "missing " + ", ".join(missing))


def check_engine_core(tree, rev):
    """The engine core's half: its targets, what it reads, and whether the engine core loads the plugins."""
    try:
        found = classes(source(tree, rev, SCHEDULER))
    except (OSError, subprocess.CalledProcessError):
        return ["engine shares: %s missing" % SCHEDULER], False
    rows, ok = check_targets(found, steps.TARGETS)
    rows.append(missing_row("Scheduler attributes read", SCHEDULER_ATTRIBUTES, init_attributes(found.get("Scheduler"))))
    out = classes(source(tree, rev, SCHEDULER_OUTPUT)).get("SchedulerOutput")
    rows.append(missing_row("SchedulerOutput fields read", SCHEDULER_OUTPUT_FIELDS,
                            {n.target.id for n in (out.body if out else []) if isinstance(n, ast.AnnAssign)}))
    req = classes(source(tree, rev, REQUEST)).get("Request")
    rows.append(missing_row("Request attributes read", SCHEDULER_REQUEST_ATTRIBUTES, init_attributes(req)))
    core = classes(source(tree, rev, ENGINE_CORE)).get("EngineCore")
    init = next((f for f in (core.body if core else []) if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
                None)
    loads = init is not None and any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "load_general_plugins"
                                     for n in ast.walk(init))
    rows.append("EngineCore.__init__ loads the general plugins: %s" % ("yes" if loads else "NO (no engine shares)"))
    return rows, ok and loads and not any("missing " in r for r in rows)


def check(tree, rev):
    found = classes(source(tree, rev, OUTPUT_PROCESSOR))
    rows, ok = check_targets(found, plugin.TARGETS)
    missing = [a for a in STATE_ATTRIBUTES if a not in init_attributes(found.get("RequestState"))]
    rows.append("RequestState attributes read: %s" % ("all there" if not missing else "missing " + ", ".join(missing)))
    req = classes(source(tree, rev, ENGINE)).get("EngineCoreRequest")
    fields = {n.target.id for n in (req.body if req else []) if isinstance(n, ast.AnnAssign)}
    missing = [f for f in REQUEST_FIELDS if f not in fields]
    rows.append("EngineCoreRequest fields read: %s" % ("all there" if not missing else "missing " + ", ".join(missing)))
    core_rows, core_ok = check_engine_core(tree, rev)
    return rows + core_rows, ok and core_ok


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
