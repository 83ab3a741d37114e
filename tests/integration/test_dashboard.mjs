// Headless Chromium against the dashboard (run by test_dashboard.sh with the server's URL).
// Prints PASS:/FAIL: lines. Traffic comes from a python3 child: N copies of 1 MiB through the
// fake libcuda (ctypes) and a loopback TCP transfer of known size.
import { createRequire } from "node:module";
import { spawn } from "node:child_process";
import path from "node:path";

const require = createRequire(path.resolve("web/package.json"));
const { chromium } = require("playwright-core");
const url = process.argv[2];
const COPIES = 24, MIB = 1 << 20, SOCK = 6 * MIB;
let failed = 0;
const pass = (n) => console.log(`PASS: ${n}`);
const fail = (n, why) => { failed++; console.log(`FAIL: ${n}: ${why}`); };
const num = (s) => Number(String(s).replace(/,/g, ""));

const traffic = `
import ctypes, os, socket, sys, threading, time
lib = ctypes.CDLL(os.environ["FAKE_CUDA"])
src = ctypes.create_string_buffer(${MIB}); dst = ctypes.create_string_buffer(${MIB})
for i in range(${COPIES}):
    assert lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ctypes.addressof(dst)), src, ctypes.c_size_t(${MIB})) == 0
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
a = socket.create_connection(srv.getsockname()); b, _ = srv.accept()
t = threading.Thread(target=a.sendall, args=(b"x" * ${SOCK},)); t.start()
got = 0
while got < ${SOCK}: got += len(b.recv(1 << 16))
t.join()
print(os.getpid(), flush=True)
time.sleep(6)
`;

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox", "--disable-gpu"] });
try {
  const page = await browser.newPage();
  const resp = await page.goto(`${url}/dashboard`);
  if (resp.status() === 200 && (await page.title()).includes("semflow")) pass("dashboard_page_loads");
  else fail("dashboard_page_loads", `status ${resp.status()}, title ${await page.title()}`);

  await page.waitForFunction(() => +(document.body.dataset.updates || 0) >= 1, null, { timeout: 10000 });
  const status = await page.textContent("#status");
  if (status.includes("eBPF on")) pass("dashboard_monitor_on");
  else fail("dashboard_monitor_on", `status says: ${status}`);
  const charts = await page.locator(".uplot").count();
  if (charts === 3) pass("dashboard_draws_uplot_charts");
  else fail("dashboard_draws_uplot_charts", `${charts} uPlot charts`);

  const before = { h2d: num(await page.textContent("#h2d-total")), tx: num(await page.textContent("#sock-tx-total")) };
  const child = spawn("python3", ["-c", traffic], { env: process.env, stdio: ["ignore", "pipe", "inherit"] });
  const pid = await new Promise((res, rej) => {
    child.stdout.once("data", (d) => res(Number(String(d).trim())));
    child.once("exit", (c) => rej(new Error(`traffic child exited ${c}`)));
  });
  // the row of the traffic process, once the page has an update covering all of it
  let row = null;
  try {
    await page.waitForFunction(([p, sock]) => {
      const tr = document.querySelector(`#procs tr[data-pid="${p}"]`);
      return tr && Number(tr.children[4].textContent.replace(/,/g, "")) > 0 &&
             Number(tr.children[9].textContent.replace(/,/g, "")) >= sock;
    }, [pid, SOCK], { timeout: 10000 });
    row = await page.$$eval(`#procs tr[data-pid="${pid}"] td`, (tds) => tds.map((t) => t.textContent));
  } catch (e) { /* reported below */ }
  const after = { h2d: num(await page.textContent("#h2d-total")), tx: num(await page.textContent("#sock-tx-total")) };
  if (row && num(row[4]) === COPIES * MIB && num(row[6]) === COPIES) pass("dashboard_shows_copies_of_a_process");
  else fail("dashboard_shows_copies_of_a_process", `pid ${pid} made ${COPIES} copies of ${MIB} B; row ${JSON.stringify(row)}`);
  if (row && num(row[9]) === SOCK && num(row[10]) === SOCK) pass("dashboard_shows_socket_bytes_of_a_process");
  else fail("dashboard_shows_socket_bytes_of_a_process", `pid ${pid} sent/received ${SOCK} B; row ${JSON.stringify(row)}`);
  if (after.h2d - before.h2d >= COPIES * MIB && after.tx - before.tx >= SOCK) pass("dashboard_totals_change_with_traffic");
  else fail("dashboard_totals_change_with_traffic", `before ${JSON.stringify(before)} after ${JSON.stringify(after)}`);
  child.kill();
} catch (e) {
  fail("dashboard_browser", e.message.split("\n")[0]);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
