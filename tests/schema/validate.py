#!/usr/bin/env python3
"""Validates `remat options --json` with an independent JSON Schema implementation.

The validator is Debian's python3-jsonschema (Draft 2020-12). First the schema itself: against the
2020-12 meta-schema, then in strict mode as Ajv has it (every keyword must be one of the draft's
vocabulary, with remat's UI metadata keyword `x-remat` declared as an annotation). Then every
config given must be accepted, and a few configs the schema must refuse are refused.

Usage: validate.py <schema.json> <config.json | doc.md>...
  .md files: every ```json block in them that is a JSON object is a config example.
"""
import json
import re
import sys

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

# Draft 2020-12's keywords (core, applicator, unevaluated, validation, meta-data, format-annotation,
# content vocabularies), and remat's own annotation.
KNOWN_KEYWORDS = {
    "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$comment", "$defs",
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "prefixItems", "items",
    "contains", "properties", "patternProperties", "additionalProperties", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties",
    "type", "const", "enum", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
    "maxProperties", "minProperties", "required", "dependentRequired",
    "title", "description", "default", "deprecated", "readOnly", "writeOnly", "examples",
    "format", "contentEncoding", "contentMediaType", "contentSchema",
    "x-remat",
}
# Keywords whose value is a map of names to subschemas, a subschema, or a list of subschemas.
SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "dependentSchemas"}
SCHEMA_VALUES = {"not", "if", "then", "else", "items", "contains", "additionalProperties", "propertyNames",
                 "unevaluatedItems", "unevaluatedProperties", "contentSchema"}
SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}


def strict_problems(schema, where="#"):
    """Unknown keywords anywhere in the schema (Ajv's strict mode), with their JSON pointer."""
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        return [f"{where}: a subschema must be an object or a boolean, not {type(schema).__name__}"]
    problems = [f"{where}: unknown keyword {key!r}" for key in schema if key not in KNOWN_KEYWORDS]
    if "x-remat" in schema and not isinstance(schema["x-remat"], dict):
        problems.append(f"{where}/x-remat: must be an object")
    for key, value in schema.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                problems += strict_problems(sub, f"{where}/{key}/{name}")
        elif key in SCHEMA_VALUES:
            problems += strict_problems(value, f"{where}/{key}")
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                problems += strict_problems(sub, f"{where}/{key}/{i}")
    return problems


def main(argv):
    if len(argv) < 3:
        print("usage: validate.py <schema.json> <config.json | doc.md>...", file=sys.stderr)
        return 2
    schema_path, inputs = argv[1], argv[2:]
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        print(f"FAIL: not a valid Draft 2020-12 schema: {error.message} at {list(error.absolute_path)}",
              file=sys.stderr)
        return 1
    problems = strict_problems(schema)
    if problems:
        print("FAIL: strict mode:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    validator = Draft202012Validator(schema)
    failures = 0
    checked = 0

    def check(label, config, want_valid):
        nonlocal failures, checked
        errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
        valid = not errors
        checked += 1
        if valid != want_valid:
            failures += 1
            detail = "" if valid else ": " + "; ".join(e.message for e in errors[:3])
            print(f"FAIL: {label}: {'refused' if want_valid else 'accepted'}{detail}", file=sys.stderr)
        else:
            print(f"ok: {label} {'valid' if want_valid else 'refused'}")

    for path in inputs:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if path.endswith(".md"):
            for i, block in enumerate(re.findall(r"```json\n(.*?)```", text, flags=re.S)):
                value = json.loads(block)
                if isinstance(value, dict):
                    check(f"{path} example {i + 1}", value, True)
        else:
            check(path, json.loads(text), True)

    # What remat accepts and the schema must too, and what it must refuse.
    accepted = {
        "integer | auto | null": [{"gradient_checkpointing_interval": 2}, {"gradient_checkpointing_interval": "auto"},
                                  {"gradient_checkpointing_interval": None},
                                  {"--gradient_checkpointing_interval": 4}],
        "null everywhere": [{"seed": None, "resume_from_checkpoint": None, "lr_scheduler": None, "lora_rank": None}],
        "integral float": [{"lora_rank": 16.0, "seed": 42.0}],
        "aliases and dashes": [{"checkpointing_steps": 100, "--num_threads": 2, "--checkpoint_step_interval": 10}],
        "value aliases": [{"lr_scheduler": "cosine_with_warmup", "optimizer": "lion", "model_flavour": "flux-dev"}],
        "SimpleTuner options remat ignores": [{"report_to": "none", "--crepa_enabled": False, "tread_config": {"routes": []}}],
    }
    for label, configs in accepted.items():
        for config in configs:
            check(label, config, True)
    refused = {
        "unknown key": {"not_an_option": 1},
        "interval 0": {"gradient_checkpointing_interval": 0},
        "interval text": {"gradient_checkpointing_interval": "every"},
        "choice": {"model_type": "partial"},
        "type": {"lora_rank": True},
        "range": {"learning_rate": 2},
        "pattern": {"device": "tpu"},
    }
    for label, config in refused.items():
        check(label, config, False)

    if failures:
        print(f"{failures} of {checked} schema checks failed", file=sys.stderr)
        return 1
    print(f"all {checked} schema checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
