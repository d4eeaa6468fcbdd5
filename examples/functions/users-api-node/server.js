// A small HTTP server on $PORT, no framework (node:http only). No package.json:
// Relay injects {"type":"module"}, so this file is ESM.
import http from "node:http";
import os from "node:os";

const users = [
  { id: "user_123", name: "John Doe" },
  { id: "user_456", name: "Ada Lovelace" },
];

function reply(res, status, body) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://localhost");
  if (url.pathname === "/users") return reply(res, 200, users);
  const user = users.find((u) => url.pathname === `/users/${u.id}`);
  if (user) return reply(res, 200, user);
  if (url.pathname === "/") {
    return reply(res, 200, {
      service: "users-api",
      greeting: process.env.GREETING,
      path: req.url,
      replica: os.hostname(),
    });
  }
  return reply(res, 404, { error: `no route for ${url.pathname}` });
});

server.listen(Number(process.env.PORT), () => {
  console.log(`users-api listening on ${process.env.PORT}`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
