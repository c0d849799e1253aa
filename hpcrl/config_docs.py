"""docs/config.md, rendered from the config tree in :mod:`hpcrl.config` (fields, types, defaults, docstrings).

``python -m hpcrl.config_docs > docs/config.md``; tests/test_config.py fails when the file is stale.
"""
from __future__ import annotations

import re
import sys
import typing

from pydantic import BaseModel

from hpcrl import config as c

ALGOS = c.ALGO_CONFIGS  # the registry's order (hpcrl.algos.registry)


def _type(annotation) -> str:
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = text.replace("typing.", "").replace("hpcrl.config.", "").replace("NoneType", "None")
    text = re.sub(r"Annotated\[(\w+), FieldInfo\([^]]*\]\)\]", r"\1", text)
    return text.replace("|", "\\|")  # a table cell


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "(section)" if isinstance(value, BaseModel) else f"`{value!r}`"
    return "required" if field.is_required() else f"`{field.default!r}`"


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) or name == "algo":
            continue
        out.append(f"| `{prefix}{name}` | {_type(ann)} | {_default(field)} | {field.description or ''} |")
    return out


def _section(title: str, model: type[BaseModel], prefix: str, level: str = "##") -> list[str]:
    doc = (model.__doc__ or "").strip().splitlines()
    head = [f"{level} {title}", ""] + ([doc[0], ""] if doc and not doc[0].startswith("!!!") else [])
    return head + ["| field | type | default | meaning |", "| --- | --- | --- | --- |", *_rows(model, prefix), ""]


def render_markdown() -> str:
    out = ["# Configuration reference", "",
           "Rendered from `hpcrl/config.py` by `python -m hpcrl.config_docs > docs/config.md`; "
           "`tests/test_config.py` fails when they differ.", "",
           "A config is YAML with one section per component. `hpcrl run` without a CONFIG runs the default job, "
           "`hpcrl/configs/cartpole.yaml`; a section or field left out takes the default below. "
           "`-o SECTION.FIELD=VALUE` overrides one value (the value is parsed as YAML).", "",
           "| field | type | default | meaning |", "| --- | --- | --- | --- |",
           *_rows(c.RunConfig, ""), ""]
    for name, field in c.RunConfig.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _section(f"`{name}`", ann, f"{name}.")
            for sub, subfield in ann.model_fields.items():
                inner = [a for a in (subfield.annotation, *typing.get_args(subfield.annotation))
                         if isinstance(a, type) and issubclass(a, BaseModel)]
                for model in inner:
                    out += _section(f"`{name}.{sub}`", model, f"{name}.{sub}.")
    out += ["## `algo`", "", "`algo.name` picks the algorithm (default `ppo`); each has its own fields.", ""]
    for model in ALGOS:
        out += _section(f"`algo.name: {model.model_fields['name'].default}`", model, "algo.", level="###")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
