// A TCP proxy in front of a server, so a test can cut the network under a
// client (`drop()`) and count the requests that went through it
// (`requests("GET /v1/ws")`: request lines seen in what clients sent, pooled
// connections or not), or stall what goes to clients (`stall()` until
// `unstall()`: a network too slow for the stream), or send new connections
// to another server (`retarget(url)`). Listens on
// loopback only; `close()` stops it.
import net from "node:net";

export async function proxy(target) {
  let { hostname, port } = new URL(target);
  const open = new Set();
  const seen = [];
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: hostname, port: Number(port) });
    const pair = { client, upstream };
    open.add(pair);
    const end = () => {
      open.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
    client.on("data", (chunk) => {
      // Request lines start a line; bodies in these tests never do.
      for (const line of chunk.toString("latin1").split("\r\n")) if (/^[A-Z]+ \/\S* HTTP\/1\.1$/.test(line)) seen.push(line);
    });
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests: (prefix) => seen.filter((line) => line.startsWith(prefix)).length,
    /** New connections go to `url` from now on (a server swapped behind the same address). */
    retarget(url) {
      ({ hostname, port } = new URL(url));
    },
    stall() {
      for (const { client, upstream } of open) {
        upstream.unpipe(client);
        upstream.pause();
      }
    },
    unstall() {
      for (const { client, upstream } of open) upstream.pipe(client);
    },
    drop() {
      for (const { client, upstream } of [...open]) {
        client.resetAndDestroy();
        upstream.destroy();
      }
      open.clear();
    },
    close() {
      this.drop();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}
