// Relay's Node bootstrap: one long-lived process serving one request at a time.
//
// Runs as `node /relay/bootstrap.mjs` inside a warm execution container.
// Requests arrive one per line on stdin, or on Relay's socket when RELAY_CHANNEL
// names one (connected before any request is served); fd 1 is reopened onto
// stderr and process.stdout.write (console.log) goes through process.stderr.
// The answer is always one frame on stderr, queued after all the handler's
// output there, and carries the request's nonce (never shown to the handler),
// so nothing the handler prints can forge a result.
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';

const GRACE_MS = Number(process.env.RELAY_GRACE_S || '2') * 1000;
const IDLE_MS = Number(process.env.RELAY_IDLE_DEADLINE_S || '330') * 1000;
const APP_DIR = process.env.RELAY_APP_DIR || process.cwd();
const END_MARKER = '\x1erelay-end:';
const CHANNEL = process.env.RELAY_CHANNEL || '';
// The most of a return value's JSON text an answer carries (relay.domain.execution
// RESULT_MAX_BYTES; a test checks both agree). The text is made ASCII first (as
// Python's json.dumps does), so characters are bytes.
const RESULT_MAX_BYTES = 16 * 1024;

// fd 1 becomes a second handle on the stderr pipe (open() takes the lowest free
// fd): raw writes to fd 1 and child processes inheriting it then share the
// answer's stream, so they too arrive before the answer. Should that fail, they
// stay on the stdout stream, which Relay forwards as output (without the ordering).
try {
  fs.closeSync(1);
  const fd = fs.openSync('/proc/self/fd/2', 'w');
  if (fd !== 1) fs.closeSync(fd);
} catch {
  try {
    fs.openSync('/dev/null', 'w'); // keep fd 1 taken: no handler file lands on it
  } catch {
    // nothing more to do
  }
}

const stderrWrite = process.stderr.write.bind(process.stderr);
process.stdout.write = (chunk, encoding, callback) => stderrWrite(chunk, encoding, callback);

// Backstop deadline that works even when a handler blocks the event loop: a
// watchdog thread kills the process once a request runs past timeout + grace.
const deadline = new BigInt64Array(new SharedArrayBuffer(8));
const watchdog = new Worker(
  `const { workerData } = require('node:worker_threads');
   const d = new BigInt64Array(workerData);
   const tick = new Int32Array(new SharedArrayBuffer(4));
   for (;;) {
     Atomics.wait(tick, 0, 0, 250);
     const at = Atomics.load(d, 0);
     if (at > 0n && BigInt(Date.now()) > at) {
       require('node:fs').writeSync(2, 'relay: handler ran past its deadline, exiting\\n');
       process.kill(process.pid, 'SIGKILL');
     }
   }`,
  { eval: true, workerData: deadline.buffer },
);
watchdog.unref();

let idleTimer = null;
function armIdle() {
  if (idleTimer) clearTimeout(idleTimer);
  idleTimer = setTimeout(() => process.exit(0), IDLE_MS);
}

function resolveModule(handler) {
  const cut = handler.lastIndexOf('.');
  if (cut <= 0 || cut === handler.length - 1) {
    throw new Error(`handler "${handler}" must be module.function`);
  }
  const base = path.join(APP_DIR, ...handler.slice(0, cut).split('.'));
  const candidates = [`${base}.mjs`, `${base}.js`, path.join(base, 'index.mjs'), path.join(base, 'index.js')];
  for (const file of candidates) {
    try {
      if (fs.statSync(file).isFile()) return [file, handler.slice(cut + 1)];
    } catch {
      // not this candidate
    }
  }
  throw new Error(`no module for handler "${handler}" (looked for ${candidates.join(', ')})`);
}

// The image is immutable: a handler found once is the same function afterwards.
const handlers = new Map();
async function loadHandler(handler) {
  let fn = handlers.get(handler);
  if (fn === undefined) {
    const [file, name] = resolveModule(handler);
    const mod = await import(pathToFileURL(file).href);
    fn = mod[name] ?? mod.default?.[name];
    if (typeof fn !== 'function') throw new Error(`module ${file} has no function "${name}"`);
    handlers.set(handler, fn);
  }
  return fn;
}

function describe(err) {
  if (err instanceof Error) return `${err.name}: ${String(err.message).split('\n')[0]}`.slice(0, 500);
  return String(err).split('\n')[0].slice(0, 500);
}

function showable(value) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch {
    text = undefined; // a BigInt, a cycle
  }
  if (text === undefined) {
    try {
      text = JSON.stringify(String(value)); // a function, a symbol, ...
    } catch {
      text = JSON.stringify(`<${typeof value} that cannot be shown>`);
    }
  }
  return text.replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

// The return value for the answer: none for undefined or null, else its JSON
// text cut at RESULT_MAX_BYTES with the full size beside it.
function resultFields(value) {
  if (value === undefined || value === null) return {};
  const text = showable(value);
  if (text.length <= RESULT_MAX_BYTES) return { result: text };
  return { result: text.slice(0, RESULT_MAX_BYTES), result_size: text.length };
}

async function serveOne(line) {
  if (idleTimer) clearTimeout(idleTimer);
  let request;
  try {
    request = JSON.parse(line);
    if (typeof request.id !== 'string' || typeof request.handler !== 'string') throw new Error('missing id or handler');
  } catch (err) {
    // no usable nonce: this can only be output (Relay's own deadline ends it)
    process.stderr.write(`\nrelay bootstrap: bad request: ${describe(err)}\n`);
    return;
  }
  const env = { ...(request.env || {}), RELAY_HANDLER: request.handler };
  const saved = {};
  for (const [key, value] of Object.entries(env)) {
    saved[key] = Object.prototype.hasOwnProperty.call(process.env, key) ? process.env[key] : undefined;
    process.env[key] = String(value);
  }
  const timeoutMs = Number(request.timeout_s || 6) * 1000;
  Atomics.store(deadline, 0, BigInt(Date.now() + timeoutMs + GRACE_MS));
  let ok = true;
  let error = '';
  let value;
  try {
    const fn = await loadHandler(request.handler);
    value = await fn(JSON.parse(request.event));
  } catch (err) {
    process.stderr.write(`${err && err.stack ? err.stack : String(err)}\n`);
    ok = false;
    error = describe(err);
  } finally {
    Atomics.store(deadline, 0, 0n);
    for (const [key, old] of Object.entries(saved)) {
      if (old === undefined) delete process.env[key];
      else process.env[key] = old;
    }
  }
  // one frame through the stderr stream, after everything queued on it (a big
  // write to a pipe can still be pending): Relay sees all the output first
  // only a run someone watches asks: delivery never pays to encode the value
  const answer = ok && request.want_result === true ? { ok, error, ...resultFields(value) } : { ok, error };
  if (channelProblem) {
    answer.channel = channelProblem; // why the offered socket is not used, said once
    channelProblem = '';
  }
  await new Promise((resolve) =>
    process.stderr.write(`${END_MARKER}${request.id}${JSON.stringify(answer)}\n`, resolve),
  );
}

process.on('unhandledRejection', (reason) => {
  process.stderr.write(`unhandled rejection: ${reason && reason.stack ? reason.stack : String(reason)}\n`);
});
process.on('uncaughtException', (err) => {
  process.stderr.write(`uncaught exception: ${err && err.stack ? err.stack : String(err)}\n`);
});

// Relay's socket, when offered: connected (or given up on) before any request
// is served, so the one connection it accepts is this bootstrap's own.
let channelProblem = '';
function connectChannel() {
  if (!CHANNEL) return Promise.resolve();
  return new Promise((resolve) => {
    let connected = false;
    const socket = net.connect(CHANNEL);
    socket.once('connect', () => {
      connected = true;
      socket.setEncoding('utf8');
      socket.on('data', reader());
      socket.on('close', () => process.exit(0)); // Relay went away
      resolve();
    });
    socket.on('error', (err) => {
      if (!connected) {
        channelProblem = `cannot connect to ${CHANNEL}: ${err.code || err.message}`;
        resolve();
      } // once connected, the close that follows an error ends the process
    });
  });
}

let queue = connectChannel();

// One reader per source: request lines, served one at a time in arrival order.
function reader() {
  let buffer = '';
  return (chunk) => {
    buffer += chunk;
    let cut;
    while ((cut = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 1);
      if (!line.trim()) continue;
      if (idleTimer) clearTimeout(idleTimer);
      queue = queue.then(() => serveOne(line)).finally(armIdle);
    }
  };
}

process.stdin.setEncoding('utf8');
process.stdin.on('data', reader());
process.stdin.on('end', () => process.exit(0));
armIdle();
