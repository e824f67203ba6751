#!/usr/bin/env node
// Validates AsyncAPI documents with the AsyncAPI project's own parser (@asyncapi/parser, pinned
// in package.json with its lock file), as AsyncAPI Studio and the CLI do: the JSON Schema of the
// specification, $ref resolution and the parser's Spectral rules. The parser does not check
// message examples against their schemas for AsyncAPI 3, so this script also does, with Ajv
// (the validator the parser itself uses) on the schemas the parser resolved.
//
// Usage: validate.mjs [--strict] FILE [--messages JSONL]
//   FILE "-" reads standard input. --strict also fails on warnings.
//   --messages: one JSON object per line, {"message": ID, "headers": {...}, "payload": ...}: a
//   message as received from the broker, checked against the headers and payload schemas of
//   the document's message ID (its key under components.messages). "headers" may be omitted.
// Prints one line per diagnostic and per failed check. Exits 0 when the document is valid and
// every example and message matches its schemas, 1 otherwise, 2 on bad usage.
import { readFileSync } from 'node:fs';
import { Parser, DiagnosticSeverity } from '@asyncapi/parser';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';

const args = process.argv.slice(2);
const strict = args[0] === '--strict';
const rest = strict ? args.slice(1) : args;
const [file, flag, messagesFile] = rest;
if (!file || (flag !== undefined && (flag !== '--messages' || !messagesFile)) || rest.length > 3) {
  console.error('usage: validate.mjs [--strict] FILE [--messages JSONL]');
  process.exit(2);
}

const names = { 0: 'error', 1: 'warning', 2: 'information', 3: 'hint' };
const text = readFileSync(file === '-' ? 0 : file, 'utf8');
const { document, diagnostics } = await new Parser().parse(text, { source: file === '-' ? undefined : file });
let errors = 0;
let warnings = 0;
for (const d of diagnostics) {
  if (d.severity === DiagnosticSeverity.Error) errors += 1;
  if (d.severity === DiagnosticSeverity.Warning) warnings += 1;
  const at = (d.path || []).join('.') || '(root)';
  console.log(`${file}: ${names[d.severity] ?? d.severity} ${d.code} at ${at}: ${d.message}`);
}
const parsed = document !== undefined && errors === 0 && !(strict && warnings > 0);
console.log(`${file}: ${parsed ? 'valid' : 'INVALID'} AsyncAPI ${document ? document.version() : '(unparsed)'} (${errors} errors, ${warnings} warnings)`);
if (!parsed) process.exit(1);

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
const validators = new Map();
function validatorOf(schema) {
  if (!validators.has(schema)) validators.set(schema, ajv.compile(schema));
  return validators.get(schema);
}
// Checks `value` against a resolved schema; prints and counts what does not match.
let mismatches = 0;
function check(what, schema, value) {
  if (schema === undefined) return;
  const validate = validatorOf(schema.json());
  if (!validate(value)) {
    mismatches += 1;
    for (const e of validate.errors) console.log(`${what}: ${e.instancePath || '(root)'} ${e.message} ${JSON.stringify(e.params)}`);
  }
}

const messages = new Map();
for (const message of document.allMessages().all()) messages.set(message.id(), message);
let examples = 0;
for (const [id, message] of messages) {
  for (const [i, example] of message.examples().all().entries()) {
    examples += 1;
    if (example.hasHeaders()) check(`example ${i} of message ${id}: headers`, message.headers(), example.headers());
    if (example.hasPayload()) check(`example ${i} of message ${id}: payload`, message.payload(), example.payload());
  }
}
let received = 0;
if (messagesFile) {
  const lines = readFileSync(messagesFile, 'utf8').split('\n').filter((l) => l.trim() !== '');
  for (const [n, line] of lines.entries()) {
    const m = JSON.parse(line);
    const message = messages.get(m.message);
    received += 1;
    if (!message) {
      mismatches += 1;
      console.log(`${messagesFile}:${n + 1}: no message ${m.message} in the document (it has ${[...messages.keys()].join(', ')})`);
      continue;
    }
    if (m.headers !== undefined) check(`${messagesFile}:${n + 1}: headers of ${m.message}`, message.headers(), m.headers);
    check(`${messagesFile}:${n + 1}: payload of ${m.message}`, message.payload(), m.payload);
  }
}
console.log(`${file}: ${examples} examples and ${received} received messages checked, ${mismatches} mismatches`);
process.exit(mismatches === 0 ? 0 : 1);
