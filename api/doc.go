// Package api holds the wire contracts ratelimitd publishes:
// rules.schema.json, the JSON Schema of the rules YAML, for editors and CI
// pipelines. Its tests keep the schema in step with the parser.
package api
