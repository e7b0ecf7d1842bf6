// Starts the pinned fauxqs SQS emulator on a free loopback port for the Go
// test harness in this directory. It prints one line, "fauxqs listening on
// <address>", once the server accepts requests, and stops when its standard
// input closes (so it never outlives the process that started it) or on
// SIGTERM/SIGINT.
import { startFauxqs } from "fauxqs";

const port = Number(process.env.FAUXQS_PORT ?? "0");
const server = await startFauxqs({ port, host: "localhost", logger: false });
process.stdout.write(`fauxqs listening on ${server.address}\n`);

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  try {
    await server.stop();
  } finally {
    process.exit(0);
  }
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
process.stdin.on("end", stop);
process.stdin.on("close", stop);
process.stdin.resume();
