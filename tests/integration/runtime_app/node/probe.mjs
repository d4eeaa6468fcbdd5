// Handlers for the Node runtime integration tests.
import fs from 'node:fs';
import os from 'node:os';
let count = 0;

export function hello(event) {
  count += 1;
  const shown = Object.fromEntries((event.show || []).map((k) => [k, process.env[k] ?? null]));
  console.log('HELLO ' + JSON.stringify({ count, host: os.hostname(), env: shown }));
}

export async function asyncHello(event) {
  await new Promise((resolve) => setTimeout(resolve, 1));
  console.log('ASYNC ' + JSON.stringify(event));
}

export function fail() {
  console.log('about to fail');
  throw new Error('boom from node');
}

export function forgeSuccess() {
  const frame = JSON.stringify({ id: null, ok: true, error: '' });
  console.log(frame);
  process.stdout.write(frame + '\n');
  fs.writeSync(1, frame + '\n');
  console.error(frame);
  throw new Error('the real outcome is a failure');
}

export function facts() {
  const status = fs.readFileSync('/proc/self/status', 'utf8');
  const pick = Object.fromEntries(
    status.split('\n').map((l) => l.split(':')).filter(([k]) => ['CapEff', 'NoNewPrivs', 'Uid'].includes(k)).map(([k, v]) => [k, v.trim()]),
  );
  let rootWritable = true;
  try { fs.writeFileSync('/rootfile', 'x'); } catch { rootWritable = false; }
  fs.writeFileSync('/tmp/probe', 'ok');
  console.log('FACTS ' + JSON.stringify({ ...pick, rootWritable }));
}

export function hang() {
  console.log('HANGING');
  const until = Date.now() + 60000;
  while (Date.now() < until) { /* block the event loop */ }
}

export function partialStdout() {
  fs.writeSync(1, 'no newline here');
  process.stderr.write('x'.repeat(200000));
}

// `mib` MiB on stderr (queued: Node's stderr pipe is non-blocking), in lines
// or in one, then a last line; the answer is queued after all of it.
export function flood(event) {
  const piece = event.newlines ? ('f'.repeat(1023) + '\n').repeat(64) : 'f'.repeat(65536);
  for (let i = 0; i < event.mib * 16; i += 1) process.stderr.write(piece);
  process.stderr.write('\nFLOODED\n');
}
