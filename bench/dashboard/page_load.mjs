// Dashboard page benchmarks (bench/dashboard/RESULTS.md), in headless
// Debian chromium against a real daemon:
//
//  A. Open time of a big job: a job gets 1,000,000 points in each of four
//     pushed series (steps 0..999,999) and no others (it was cancelled while
//     queued, so the first chart shows one of them, bench_a, as it would a
//     long job's loss); the job page is opened --runs times, each in a
//     fresh page, timed from navigation to the first chart drawn with its
//     points (each series read with max_points=2000, so this includes the
//     daemon's downsampling).  The first open is the cold one (the
//     daemon's answer cache is empty).  With --with-own-series the job
//     trains 20 steps first, so its first chart is its own 20-point loss
//     (the setup of the first measurements).
//  B. Cost of open dashboards to training: the same training job (fixed
//     steps, synthetic data, 1 CPU device) run alternately with 0 and with
//     5 job pages open on it in chromium (on the same machine, so the
//     browser's own CPU counts too), and with 5 clients making the page's
//     requests without a browser (the daemon's share), --rounds rounds;
//     samples/s from steps * batch / (finished_at - started_at).
//
// Usage: node bench/dashboard/page_load.mjs BUILD_DIR [--runs 5] [--rounds 3]
//        [--points 1000000] [--steps 40000] [--only open|load] [--with-own-series]
import { chromium } from 'playwright-core';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const args = process.argv.slice(2);
const build = args[0];
if (!build) {
	console.error('usage: page_load.mjs BUILD_DIR [--runs N] [--rounds N] [--points N] [--steps N] [--only open|load]');
	process.exit(2);
}
const opt = (name, def) => {
	const i = args.indexOf(name);
	return i >= 0 ? args[i + 1] : def;
};
const RUNS = Number(opt('--runs', 5)), ROUNDS = Number(opt('--rounds', 3));
const POINTS = Number(opt('--points', 1000000)), STEPS = Number(opt('--steps', 40000));
const ONLY = opt('--only', '');
const trainerd = path.resolve(build, 'daemon', 'trainerd');

const daemons = [];
process.on('exit', () => { for (const d of daemons) { try { d.proc.kill('SIGKILL'); } catch (e) { /* gone */ } } });
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(1));

async function startDaemon(devices) {
	const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'trainerd-bench-ui-'));
	const proc = spawn(trainerd, ['serve', '--listen', '127.0.0.1:0', '--state-dir', dir, '--data-root', dir,
		'--cpu-devices', String(devices), '--backend', 'cpu', '--openapi', '', '--log-level', 'warning'],
	{ stdio: 'ignore' });
	for (let i = 0; i < 100; i++) {
		await new Promise((r) => setTimeout(r, 100));
		try {
			const addr = fs.readFileSync(path.join(dir, 'listen.addr'), 'utf8').trim();
			const d = { proc, dir, url: addr.startsWith('http') ? addr : 'http://' + addr };
			daemons.push(d);
			return d;
		} catch (e) { /* not yet */ }
	}
	throw new Error('trainerd did not start');
}
function stopDaemon(d) {
	d.proc.kill('SIGTERM');
	setTimeout(() => { try { d.proc.kill('SIGKILL'); } catch (e) { /* gone */ } fs.rmSync(d.dir, { recursive: true, force: true }); }, 3000);
}
async function post(url, body) {
	for (let attempt = 0; ; attempt++) {
		const r = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
		if (r.status === 503 && attempt < 200) { await new Promise((res) => setTimeout(res, 200)); continue; }
		if (r.status >= 300) throw new Error(url + ': HTTP ' + r.status + ' ' + (await r.text()));
		return r.json();
	}
}
async function waitState(d, id, states, timeoutMs) {
	const end = Date.now() + timeoutMs;
	while (Date.now() < end) {
		const j = await (await fetch(d.url + '/jobs/' + id)).json();
		if (states.includes(j.state)) return j;
		await new Promise((r) => setTimeout(r, 100));
	}
	throw new Error('job ' + id + ' did not reach ' + states);
}
const job = (name, steps, devices) => ({
	name, seed: 1,
	model: { inputs: 32, layers: [{ type: 'dense', units: 64 }, { type: 'relu' }, { type: 'dense', units: 4 }] },
	data: { train: { format: 'synthetic', samples: 8192, features: 32, classes: 4 }, validation_split: 0.1 },
	batch_size: 64, max_steps: steps, optimizer: { type: 'adam', lr: 0.002 }, devices,
});
/* What one open job page asks of the daemon, without the browser: the
 * event stream, and each second the new metric steps and the job (plus
 * checkpoints and devices every 5 s), as api/ui/app.js does. */
async function dashboardRequests(d, id, signal) {
	const sse = fetch(d.url + '/jobs/' + id + '/events', { signal }).then(async (r) => {
		const reader = r.body.getReader();
		for (;;) { const { done } = await reader.read(); if (done) break; }
	}).catch(() => {});
	let last = -1;
	for (let tick = 0; !signal.aborted; tick++) {
		try {
			const q = 'max_points=2000&epochs=true&times=true' + (last >= 0 ? '&from_step=' + (last + 1) : '');
			const m = await (await fetch(d.url + '/jobs/' + id + '/metrics?' + q, { signal })).json();
			for (const s of Object.values(m.series)) if (s.steps.length) last = Math.max(last, s.steps[s.steps.length - 1]);
			await (await fetch(d.url + '/jobs/' + id, { signal })).text();
			if (tick % 5 === 0) {
				await (await fetch(d.url + '/jobs/' + id + '/checkpoints', { signal })).text();
				await (await fetch(d.url + '/devices', { signal })).text();
			}
		} catch (e) { if (signal.aborted) break; }
		await new Promise((r) => { const t = setTimeout(r, 1000); signal.addEventListener('abort', () => { clearTimeout(t); r(); }, { once: true }); });
	}
	await sse;
}
const median = (a) => { const s = [...a].sort((x, y) => x - y); return s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
	args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage'] });
const out = [];
try {
	if (ONLY !== 'load') {
		const d = await startDaemon(1);
		let id;
		if (args.includes('--with-own-series')) {
			id = (await post(d.url + '/jobs', job('bench-open', 20, 1))).id;
			await waitState(d, id, ['completed'], 60000);
		} else {
			/* Queued behind a job that holds the only device, then
			 * cancelled: a job with no series of its own. */
			const blocker = (await post(d.url + '/jobs', job('bench-blocker', 10000000, 1))).id;
			await waitState(d, blocker, ['running'], 60000);
			id = (await post(d.url + '/jobs', job('bench-open', 20, 1))).id;
			await post(d.url + '/jobs/' + id + '/cancel', {});
			await post(d.url + '/jobs/' + blocker + '/cancel', {});
			await waitState(d, id, ['cancelled'], 60000);
			await waitState(d, blocker, ['cancelled'], 60000);
		}
		const t0 = Date.now();
		const names = ['bench_a', 'bench_b', 'bench_c', 'bench_d'];
		for (const [k, name] of names.entries()) {
			for (let from = 0; from < POINTS; from += 10000) {
				const points = [];
				for (let s = from; s < Math.min(POINTS, from + 10000); s++)
					points.push({ name, step: s, value: 2 * Math.exp(-s / 200000) + 0.05 * Math.sin(s * 0.37 + k) });
				await post(d.url + '/jobs/' + id + '/metrics', { points });
			}
		}
		/* Wait for the last flush. */
		for (let i = 0; i < 100; i++) {
			const r = await (await fetch(d.url + '/jobs/' + id + '/metrics?names=bench_d&from_step=' + (POINTS - 1))).json();
			if (r.series.bench_d) break;
			await new Promise((res) => setTimeout(res, 200));
		}
		console.error(`pushed ${names.length} x ${POINTS} points in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
		const times = [], inPage = [];
		for (let r = 0; r < RUNS; r++) {
			const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
			const start = Date.now();
			await page.goto(d.url + '/#/jobs/' + id);
			await page.waitForFunction(() => {
				const el = document.querySelector('[data-chart="0"]');
				return el && Number(el.dataset.points) > 0 && el.querySelector('canvas');
			}, null, { timeout: 30000, polling: 'raf' });
			times.push(Date.now() - start);
			inPage.push(await page.evaluate(() => {
				const m = performance.getEntriesByName('trainerd:first-chart')[0];
				return m ? Math.round(m.startTime) : NaN;
			}));
			const res = await page.evaluate(() => performance.getEntriesByType('resource')
				.filter((e) => /\/jobs\//.test(e.name))
				.map((e) => `${e.name.replace(/^.*\/jobs\//, '/jobs/').slice(0, 60)} ${e.startTime.toFixed(0)}+${e.duration.toFixed(0)}ms ${e.encodedBodySize}B`));
			console.error(`open ${r}: ${times[r]} ms (in page ${inPage[r]} ms); ` + res.join('; '));
			if (r === 0) {
				/* And a chart of one 1M-point series (already read). */
				const s2 = Date.now();
				await page.selectOption('#add-chart', 'bench_a');
				await page.waitForSelector('[data-chart="1"] canvas', { timeout: 10000 });
				out.push(`chart of bench_a added in ${Date.now() - s2} ms`);
			}
			await page.close();
		}
		out.push(`| open a job page, 4 series x ${POINTS} points | cold ${times[0]} ms | median of ${RUNS} ${median(times)} ms | all: ${times.join(', ')} ms | from navigation start (page's clock): ${inPage.join(', ')} ms | load average ${os.loadavg()[0].toFixed(1)} on ${os.cpus().length} cores |`);
		stopDaemon(d);
	}
	if (ONLY !== 'open') {
		const d = await startDaemon(1);
		const rates = { 0: [], 5: [], http5: [] };
		for (let round = 0; round < ROUNDS; round++) {
			for (const n of [0, 5, 'http5']) {
				const { id } = await post(d.url + '/jobs', job('bench-load-' + n, STEPS, 1));
				await waitState(d, id, ['running', 'completed'], 30000);
				const pages = [], stop = new AbortController();
				const clients = [];
				if (n === 'http5') {
					for (let i = 0; i < 5; i++) clients.push(dashboardRequests(d, id, stop.signal));
				} else {
					for (let i = 0; i < n; i++) {
						const p = await browser.newPage({ viewport: { width: 1280, height: 900 } });
						await p.goto(d.url + '/#/jobs/' + id);
						pages.push(p);
					}
				}
				const j = await waitState(d, id, ['completed', 'failed'], 600000);
				stop.abort();
				await Promise.allSettled(clients);
				for (const p of pages) await p.close();
				const wall = (Date.parse(j.finished_at) - Date.parse(j.started_at)) / 1000;
				rates[n].push((STEPS * 64) / wall);
				console.error(`round ${round}: ${n} dashboards: ${((STEPS * 64) / wall).toFixed(0)} samples/s (${wall.toFixed(2)} s)`);
			}
		}
		const m0 = median(rates[0]), m5 = median(rates[5]), mh = median(rates.http5);
		out.push(`| training, ${STEPS} steps, 1 CPU device | 5 dashboards' requests without a browser ${mh.toFixed(0)} samples/s | slowdown ${(100 * (1 - mh / m0)).toFixed(1)}% (rounds: ${rates.http5.map((x) => x.toFixed(0)).join(', ')}) |`);
		out.push(`| load average ${os.loadavg()[0].toFixed(1)} on ${os.cpus().length} cores |`);
		out.push(`| training, ${STEPS} steps, 1 CPU device | 0 dashboards ${m0.toFixed(0)} samples/s | 5 dashboards ${m5.toFixed(0)} samples/s | slowdown ${(100 * (1 - m5 / m0)).toFixed(1)}% (rounds: ${rates[0].map((x) => x.toFixed(0)).join(', ')} vs ${rates[5].map((x) => x.toFixed(0)).join(', ')}) |`);
		stopDaemon(d);
	}
} finally {
	await browser.close();
}
console.log(out.join('\n'));
setTimeout(() => process.exit(0), 3500);
