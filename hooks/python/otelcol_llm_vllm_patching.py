"""What both halves of the vLLM plugin share: ``otelcol_llm_vllm`` in the API server, ``otelcol_llm_vllm_steps`` in
the engine core. How a method of vLLM is made a target, checked before it is wrapped and marked once it is; what
the plugin counts of itself (``otelcol_llm_vllm.stats()``); and its log, which says each thing once.
"""

import inspect
import logging

_log = logging.getLogger("vllm.plugins.otelcol_llm")

# The attribute that marks a function as one of the plugin's wrappers (install is idempotent).
MARK = "_otelcol_llm_wrapped"


class Target:
    """One method the plugin wraps: where it is, the parameters the plugin reads, and whether the plugin can work
    without it."""

    def __init__(self, cls, method, params, essential):
        self.cls, self.method, self.params, self.essential = cls, method, tuple(params), essential

    @property
    def name(self):
        return "%s.%s" % (self.cls, self.method)


class Counters:
    """What the plugin itself counts, whether or not its client exists yet."""

    def __init__(self):
        self.refused = 0
        self.installed = False
        self.steps_installed = False
        self.rust_frontend = False
        self.register_errors = 0


counters = Counters()
said = set()


def say_once(key, level, msg, *args):
    if key in said:
        return
    said.add(key)
    _log.log(level, msg, *args)


def refuse(target, why):
    counters.refused += 1
    say_once(("refused", target.name), logging.WARNING,
              "otelcol-llm vLLM plugin: not patching %s: %s; vLLM runs unchanged there", target.name, why)


def check(cls, target):
    """The function to wrap, and how to find each parameter the plugin reads in a call (position counted with
    self, and name); or None and why not."""
    if cls is None:
        return None, "class %s not found" % target.cls
    try:
        func = inspect.getattr_static(cls, target.method)
    except AttributeError:
        return None, "no such method"
    if not inspect.isfunction(func):
        return None, "not a plain function (%s)" % type(func).__name__
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError) as e:
        return None, "signature unreadable (%s)" % type(e).__name__
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return None, "no self parameter"
    where = {}
    for name in target.params:
        for i, p in enumerate(params):
            if p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY):
                where[name] = (i if p.kind != p.KEYWORD_ONLY else None, name if p.kind != p.POSITIONAL_ONLY else None)
                break
        else:
            return None, "it has no parameter %r (its signature: %s)" % (name, inspect.signature(func))
    return (func, where), None


def arg(where, args, kwargs, name):
    pos, key = where[name]
    if pos is not None and len(args) > pos:
        return args[pos]
    return kwargs.get(key) if key is not None else None
