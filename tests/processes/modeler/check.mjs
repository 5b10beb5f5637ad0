#!/usr/bin/env node
// Modeler-side check of inferlb's BPMN files, as a modeler user's CI would run it:
//
//   1. import each file with bpmn-moddle (the parser under bpmn.io and Camunda Modeler) plus the
//      camunda-bpmn-moddle descriptors; any import warning (unknown element or attribute, unresolved
//      reference, duplicate id…) fails the file;
//   2. lint it with bpmnlint using ./.bpmnlintrc (bpmnlint:recommended); errors fail the file,
//      warnings are printed.
//
// Files: every processes/*.bpmn and every tests/processes/fixtures/*.bpmn except the fixtures that
// are broken on purpose for the validator tests. Pass paths as arguments to check only those.
//
// Usage: node check.mjs [FILE.bpmn ...]      (after ./install.sh)
// Exit status: 0 when every file passes, 1 when one fails, 2 when the check itself cannot run.

import { readFile, readdir } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, '..', '..', '..');
const FIXTURES = path.join(REPO, 'tests', 'processes', 'fixtures');

// Fixtures that are wrong for inferlb on purpose (validator tests), not modeler deliverables.
const EXCLUDED_FIXTURES = new Set([ 'broken_unknown_op.bpmn', 'missing_dispatch.bpmn' ]);

// Resolve everything from this folder's node_modules, whatever the current directory is.
const require = createRequire(import.meta.url);

let BpmnModdle, camundaDescriptor, Linter, NodeResolver;
try {
  ({ default: BpmnModdle } = await import('bpmn-moddle'));
  camundaDescriptor = require('camunda-bpmn-moddle/resources/camunda.json');
  ({ Linter } = require('bpmnlint'));
  NodeResolver = require('bpmnlint/lib/resolver/node-resolver');
} catch (error) {
  console.error(`cannot load the modeler tooling (${error.message}); run ${path.join(HERE, 'install.sh')}`);
  process.exit(2);
}

async function listBpmn(dir, exclude = new Set()) {
  let names;
  try {
    names = await readdir(dir);
  } catch (error) {
    if (error.code === 'ENOENT') return [];
    throw error;
  }
  return names
    .filter(name => name.endsWith('.bpmn') && !exclude.has(name))
    .sort()
    .map(name => path.join(dir, name));
}

async function defaultFiles() {
  return [
    ...await listBpmn(path.join(REPO, 'processes')),
    ...await listBpmn(FIXTURES, EXCLUDED_FIXTURES)
  ];
}

function describeWarning(warning) {
  const id = warning.element && warning.element.id;
  const message = String(warning.message || warning).split('\n')[0];
  return id ? `${id}: ${message}` : message;
}

/**
 * @return {Promise<{ errors: string[], warnings: string[] }>}
 */
async function checkFile(file, config) {
  const errors = [];
  const warnings = [];
  const xml = await readFile(file, 'utf-8');

  // a fresh moddle per file: ids are registered per instance
  const moddle = new BpmnModdle({ camunda: camundaDescriptor });

  let definitions;
  try {
    const result = await moddle.fromXML(xml, 'bpmn:Definitions');
    definitions = result.rootElement;
    for (const warning of result.warnings || []) {
      errors.push(`import warning: ${describeWarning(warning)}`);
    }
  } catch (error) {
    errors.push(`import failed: ${String(error.message).split('\n')[0]}`);
    for (const warning of error.warnings || []) {
      errors.push(`import warning: ${describeWarning(warning)}`);
    }
    return { errors, warnings };
  }

  // a fresh linter per file too: some rules (no-duplicate-sequence-flows) keep state per instance
  const linter = new Linter({ config, resolver: new NodeResolver({ require }) });
  const reports = await linter.lint(definitions);
  for (const [ rule, ruleReports ] of Object.entries(reports)) {
    for (const report of ruleReports) {
      const line = `${report.id || '-'}: ${report.message} (${rule})`;
      if (report.category === 'error') {
        errors.push(line);
      } else {
        warnings.push(line);
      }
    }
  }
  return { errors, warnings };
}

async function main(argv) {
  const config = JSON.parse(await readFile(path.join(HERE, '.bpmnlintrc'), 'utf-8'));

  const files = argv.length ? argv.map(file => path.resolve(file)) : await defaultFiles();
  if (!files.length) {
    console.error('no BPMN files found');
    return 2;
  }

  let failed = 0;
  let warned = 0;
  for (const file of files) {
    const relative = path.relative(REPO, file);
    const shown = relative && !relative.startsWith('..') ? relative : file;
    const { errors, warnings } = await checkFile(file, config);
    const status = errors.length ? 'FAIL' : 'ok  ';
    const counts = [ errors.length && `${errors.length} error(s)`, warnings.length && `${warnings.length} warning(s)` ]
      .filter(Boolean).join(', ');
    console.log(`${status} ${shown}${counts ? ` (${counts})` : ''}`);
    for (const line of errors) console.log(`       error    ${line}`);
    for (const line of warnings) console.log(`       warning  ${line}`);
    if (errors.length) failed += 1;
    warned += warnings.length;
  }

  console.log(`\n${files.length} file(s) checked: ${failed} failed, ${warned} warning(s)`);
  return failed ? 1 : 0;
}

try {
  process.exitCode = await main(process.argv.slice(2));
} catch (error) {
  console.error(error);
  process.exitCode = 2;
}
