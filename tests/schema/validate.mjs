// Validates `remat options --json` with an independent JSON Schema implementation (Ajv, Draft
// 2020-12): the schema itself against the 2020-12 meta-schema (Ajv's strict mode on, remat's UI
// metadata keyword `x-remat` declared as an annotation), then every config given, and a few
// configs the schema must refuse.
// Usage: node validate.mjs <schema.json> <config.json | doc.md>...
//   .md files: every ```json block in them that is a JSON object is a config example.
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";

const [schemaPath, ...inputs] = process.argv.slice(2);
if (!schemaPath || inputs.length === 0) {
  console.error("usage: node validate.mjs <schema.json> <config.json | doc.md>...");
  process.exit(2);
}
const schema = JSON.parse(readFileSync(schemaPath, "utf8"));
const ajv = new Ajv2020({ strict: true, allErrors: true, allowUnionTypes: true });
ajv.addKeyword({ keyword: "x-remat", schemaType: "object" });
if (!ajv.validateSchema(schema)) {
  console.error("FAIL: not a valid Draft 2020-12 schema:", ajv.errorsText(ajv.errors));
  process.exit(1);
}
const validate = ajv.compile(schema);
let failures = 0;
let checked = 0;

function check(label, config, wantValid) {
  const valid = validate(config);
  checked += 1;
  if (valid !== wantValid) {
    failures += 1;
    console.error(`FAIL: ${label}: ${wantValid ? "refused" : "accepted"}` +
                  (valid ? "" : `: ${ajv.errorsText(validate.errors)}`));
  } else {
    console.log(`ok: ${label} ${wantValid ? "valid" : "refused"}`);
  }
}

for (const path of inputs) {
  const text = readFileSync(path, "utf8");
  if (path.endsWith(".md")) {
    const blocks = [...text.matchAll(/```json\n([\s\S]*?)```/g)].map((m) => m[1]);
    blocks.forEach((block, i) => {
      const value = JSON.parse(block);
      if (value !== null && typeof value === "object" && !Array.isArray(value)) {
        check(`${path} example ${i + 1}`, value, true);
      }
    });
  } else {
    check(path, JSON.parse(text), true);
  }
}

// What remat accepts and the schema must too, and what it must refuse.
const accepted = {
  "integer | auto | null": [{ gradient_checkpointing_interval: 2 }, { gradient_checkpointing_interval: "auto" },
                            { gradient_checkpointing_interval: null }, { "--gradient_checkpointing_interval": 4 }],
  "null everywhere": [{ seed: null, resume_from_checkpoint: null, lr_scheduler: null, lora_rank: null }],
  "integral float": [{ lora_rank: 16.0, seed: 42.0 }],
  "aliases and dashes": [{ checkpointing_steps: 100, "--num_threads": 2, "--checkpoint_step_interval": 10 }],
  "value aliases": [{ lr_scheduler: "cosine_with_warmup", optimizer: "lion", model_flavour: "flux-dev" }],
  "SimpleTuner options remat ignores": [{ report_to: "none", "--use_ema": false, tread_config: { routes: [] } }],
};
for (const [label, configs] of Object.entries(accepted)) configs.forEach((c) => check(label, c, true));
const refused = {
  "unknown key": { not_an_option: 1 },
  "interval 0": { gradient_checkpointing_interval: 0 },
  "interval text": { gradient_checkpointing_interval: "every" },
  "choice": { model_type: "partial" },
  "type": { lora_rank: true },
  "range": { learning_rate: 2 },
  "pattern": { device: "tpu" },
};
for (const [label, c] of Object.entries(refused)) check(label, c, false);

if (failures > 0) {
  console.error(`${failures} of ${checked} schema checks failed`);
  process.exit(1);
}
console.log(`all ${checked} schema checks passed`);
