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
//  B. Steady-state cost of open dashboards to training (loadBench below):
//     per arm a fresh job of unbounded length (synthetic data, 1 CPU
//     device) with no page, --pages job pages in chromium, or --pages
//     clients making the page's requests without a browser (--client page:
//     as api/ui/app.js does now; --client allseries: every series each
//     second, as it did before it polled only the charted ones; an arm
//     requests:KIND uses KIND in that arm; --client old: as it did before the
//     section B fixes in RESULTS.md); pages open and settle (--settle s),
//     then over --window s the job's samples/s (two of its steps and the
//     wall times it recorded for them) and the CPU time of the daemon's
//     threads (training vs the rest), the browser's processes and this
//     process, from /proc.  Arms alternate within each of --rounds rounds;
//     medians.  --pin CPUS tasksets the browser's processes and this one
//     (the request-only clients), --pin-daemon CPUS the daemon's threads:
//     on separate cores, pages watch as from another machine.  --job
//     quickstart (or fashion-mlp) trains that example (epochs without
//     end, 1 device) instead of the worst case, a tiny model that records
//     five series every step.
//
// Usage: node bench/dashboard/page_load.mjs BUILD_DIR [--runs 5] [--rounds 3]
//        [--points 1000000] [--only open|load] [--with-own-series]
//        [--settle 5] [--window 20] [--pages 5] [--arms none,chromium,requests]
//        [--client page|allseries|old] [--pin CPUS] [--pin-daemon CPUS] [--job tiny|quickstart|fashion-mlp]
import { chromium } from 'playwright-core';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const args = process.argv.slice(2);
const build = args[0];
if (!build) {
	console.error('usage: page_load.mjs BUILD_DIR [--runs N] [--rounds N] [--points N] [--only open|load] [--settle S] [--window S] [--pages N] [--arms LIST] [--client page|allseries|old] [--pin CPUS]');
	process.exit(2);
}
const opt = (name, def) => {
	const i = args.indexOf(name);
	return i >= 0 ? args[i + 1] : def;
};
const RUNS = Number(opt('--runs', 5)), ROUNDS = Number(opt('--rounds', 3));
const POINTS = Number(opt('--points', 1000000));
const ONLY = opt('--only', '');
const SETTLE = Number(opt('--settle', 5)), WINDOW = Number(opt('--window', 20)), PAGES = Number(opt('--pages', 5));
const CLIENT = opt('--client', 'page'), ARMS = opt('--arms', 'none,chromium,requests').split(',');
const PIN = opt('--pin', ''); /* e.g. "1": taskset the browser's processes onto these CPUs */
const PIN_DAEMON = opt('--pin-daemon', ''); /* e.g. "0": the daemon's threads onto these */
const JOB = opt('--job', 'tiny');
const INCR_POINTS = 200;
const trainerd = path.resolve(build, 'daemon', 'trainerd');

const daemons = [];
process.on('exit', () => { for (const d of daemons) { try { d.proc.kill('SIGKILL'); } catch (e) { /* gone */ } } });
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(1));

async function startDaemon(devices) {
	const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'trainerd-bench-ui-'));
	const proc = spawn(trainerd, ['serve', '--listen', '127.0.0.1:0', '--state-dir', dir, '--data-root', dir,
		'--cpu-devices', String(devices), '--backend', 'cpu', '--openapi', '', '--log-level', 'warning'],
	{ stdio: 'ignore' });
	if (PIN_DAEMON) spawn('taskset', ['-a', '-p', '-c', PIN_DAEMON, String(proc.pid)], { stdio: 'ignore' });
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
/* Section B's job: the tiny worst case above, or an example of the
 * repository trained without end on 1 device. */
function loadJob(name) {
	if (JOB === 'tiny') return job(name, 1e9, 1);
	const spec = JSON.parse(fs.readFileSync(new URL('../../examples/' + JOB + '.json', import.meta.url), 'utf8'));
	return { ...spec, name, epochs: 100000, devices: 1 };
}
/* What one open job page asks of the daemon, without the browser, as
 * api/ui/app.js does.  'page' (default): the event stream without metrics
 * events (types=state,log), each second the job and the metric steps after
 * the newest one it has (at most INCR_POINTS a series), backing off to 4 s
 * while nothing new comes, checkpoints and devices every 15 s; the points
 * a poll asks for follow the new steps' share of the curve.  'old' (the
 * page before bench/dashboard/RESULTS.md section B's fixes): the whole
 * event stream (every raw point), max_points=2000 increments, the job each
 * second, checkpoints and devices every 5 s.  Counts requests and bytes. */
async function dashboardRequests(d, id, signal, kind, count) {
	const got = async (url, what) => {
		const r = await fetch(url, { signal });
		const t = await r.text();
		count[what] = (count[what] || 0) + 1;
		count.bytes = (count.bytes || 0) + t.length;
		return t;
	};
	const old = kind === 'old';
	const sse = fetch(d.url + '/jobs/' + id + '/events' + (old ? '' : '?types=state,log'), { signal }).then(async (r) => {
		const reader = r.body.getReader();
		for (;;) {
			const { done, value } = await reader.read();
			if (done) break;
			count.sse_bytes = (count.sse_bytes || 0) + value.length;
		}
	}).catch(() => {});
	let last = -1, first = Infinity, now = null, wait = 1000, sinceSlow = 0;
	/* Newest step per series, and where the poll of every series goes on
	 * from ('page': each second only the default chart's series, every
	 * OTHERS_MS all of them; 'allseries', the page before that change:
	 * every series each second). */
	const lastOf = {};
	let othersFrom = -1, othersAt = 0;
	const SHOWN = ['loss', 'val_loss'];
	/* api/ui/app.js's incrPoints and pollMetrics */
	const incr = (from) => (!(now > from) || !(from > first) ? INCR_POINTS
		: Math.max(16, Math.min(INCR_POINTS, Math.ceil((2000 * (now - from)) / (now - first)))));
	while (!signal.aborted) {
		try {
			const shown = kind === 'page' ? SHOWN.filter((n) => n in lastOf) : [];
			const all = old || kind !== 'page' || !shown.length || othersFrom < 0 || Date.now() - othersAt >= 10000;
			/* The page re-reads its newest step (points written after that
			 * step's evaluation come last) and counts only points past it;
			 * before, it read from the step after. */
			const fromStep = all ? (kind === 'page' && othersFrom >= 0 ? othersFrom : last) : Math.max(...shown.map((n) => lastOf[n]));
			const from = old ? fromStep + 1 : fromStep;
			const q = (all ? '' : 'names=' + shown.join(',') + '&') + 'max_points=' + (old || fromStep < 0 ? 2000 : incr(fromStep))
				+ '&epochs=true&times=true' + (fromStep >= 0 ? '&from_step=' + from : '');
			const m = JSON.parse(await got(d.url + '/jobs/' + id + '/metrics?' + q, 'metrics'));
			let added = 0, newest = fromStep;
			for (const [name, s] of Object.entries(m.series)) if (s.steps.length) {
				const had = name in lastOf ? lastOf[name] : -1;
				lastOf[name] = Math.max(had, s.steps[s.steps.length - 1]);
				last = Math.max(last, lastOf[name]);
				newest = Math.max(newest, lastOf[name]);
				first = Math.min(first, s.steps[0]);
				added += s.steps.filter((step) => step > had).length;
			}
			if (all) { othersFrom = newest; othersAt = Date.now(); }
			const j = JSON.parse(await got(d.url + '/jobs/' + id, 'job'));
			now = j.progress ? j.progress.step : null;
			if (Date.now() - sinceSlow >= (old ? 5000 : 15000)) {
				sinceSlow = Date.now();
				await got(d.url + '/jobs/' + id + '/checkpoints', 'checkpoints');
				await got(d.url + '/devices', 'devices');
			}
			wait = old || added ? 1000 : Math.min(4000, wait * 2);
		} catch (e) { if (signal.aborted) break; }
		await new Promise((r) => { const t = setTimeout(r, wait); signal.addEventListener('abort', () => { clearTimeout(t); r(); }, { once: true }); });
	}
	await sse;
}
const median = (a) => { const s = [...a].sort((x, y) => x - y); return s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };


/* ---- CPU time from /proc (clock ticks of CLK_TCK, 100 on Linux) ---- */
const TICK_MS = 10;
function statOf(pid) {
	try {
		const t = fs.readFileSync('/proc/' + pid + '/stat', 'utf8');
		const close = t.lastIndexOf(')');
		const f = t.slice(close + 2).split(' ');
		/* after ")": state ppid ... utime(14) stime(15): indexes 11, 12 */
		return { comm: t.slice(t.indexOf('(') + 1, close), ppid: Number(f[1]), cpu: Number(f[11]) + Number(f[12]) };
	} catch (e) { return null; }
}
/* The daemon's CPU time by thread: the training job's threads (tr-job*,
 * tr-rank*, tr-loader, and threads they started, which inherit the name),
 * the metrics writer (tr-metrics: its work follows the training rate, not
 * the pages) and the rest (HTTP connections, the scheduler). */
function daemonCpu(pid) {
	let train = 0, serve = 0, writer = 0;
	let tids = [];
	try { tids = fs.readdirSync('/proc/' + pid + '/task'); } catch (e) { /* gone */ }
	for (const tid of tids) {
		const st = statOf(pid + '/task/' + tid);
		if (!st) continue;
		if (/^tr-(job|rank|loader)/.test(st.comm)) train += st.cpu;
		else if (st.comm === 'tr-metrics') writer += st.cpu;
	}
	/* The rest from the process's total, which keeps the time of threads
	 * that ended (one per HTTP connection). */
	const all = statOf(pid);
	serve = all ? all.cpu - train - writer : 0;
	return { train: train * TICK_MS, serve: serve * TICK_MS, writer: writer * TICK_MS };
}
/* Every process below this one (the browser's, not the daemons'): pid -> ms. */
function browserCpu(exclude) {
	const kids = new Map();
	for (const e of fs.readdirSync('/proc')) {
		if (!/^\d+$/.test(e)) continue;
		const st = statOf(e);
		if (!st) continue;
		if (!kids.has(st.ppid)) kids.set(st.ppid, []);
		kids.get(st.ppid).push([Number(e), st.cpu]);
	}
	const out = new Map(), todo = [process.pid];
	while (todo.length) {
		for (const [pid, cpu] of kids.get(todo.pop()) || []) {
			if (exclude.has(pid)) continue;
			out.set(pid, cpu * TICK_MS);
			todo.push(pid);
		}
	}
	return out;
}
function cpuSnap(d) {
	const u = process.cpuUsage();
	return { t: performance.now(), daemon: daemonCpu(d.proc.pid), browser: browserCpu(new Set(daemons.map((x) => x.proc.pid))),
		node: (u.user + u.system) / 1000 };
}
function cpuDelta(a, b) {
	let browserMs = 0;
	for (const [pid, ms] of b.browser) browserMs += ms - (a.browser.get(pid) || 0);
	const s = (b.t - a.t) / 1000;
	return { s, train: (b.daemon.train - a.daemon.train) / s, serve: (b.daemon.serve - a.daemon.serve) / s,
		writer: (b.daemon.writer - a.daemon.writer) / s,
		browser: browserMs / s, node: (b.node - a.node) / s };
}
const sleepMs = (ms) => new Promise((r) => setTimeout(r, ms));
async function jobStep(d, id) {
	return (await (await fetch(d.url + '/jobs/' + id)).json()).progress.step;
}
/* The wall time the job recorded for step (its loss point): the job's own
 * clock, so the samples/s below is the trainer's, not the client's. */
async function stepWall(d, id, step) {
	for (let i = 0; i < 50; i++) {
		const r = await (await fetch(d.url + '/jobs/' + id + '/metrics?names=loss&max_points=0&times=true&from_step=' + step + '&to_step=' + step)).json();
		const s = r.series && r.series.loss;
		if (s && s.steps.length) return s.times[0];
		await sleepMs(100);
	}
	throw new Error('no loss point at step ' + step);
}
if (PIN) spawn('taskset', ['-a', '-p', '-c', PIN, String(process.pid)], { stdio: 'ignore' });
function pin(pids) {
	for (const pid of pids) spawn('taskset', ['-a', '-p', '-c', PIN, String(pid)], { stdio: 'ignore' });
}

/* B. Steady-state cost of open pages: each arm (no page, PAGES job pages in
 * chromium, PAGES request-only clients) gets a fresh job of unbounded
 * length; pages are opened and SETTLE s allowed for their first reads,
 * then a WINDOW s window measures the job's samples/s (two of its own
 * steps and their recorded wall times), and the CPU time of the daemon's
 * threads, the browser's processes and this process.  Arms alternate
 * within each round; medians over rounds. */
async function loadBench(out) {
	const d = await startDaemon(1);
	const res = {};
	for (const arm of ARMS) res[arm] = [];
	const loads = [];
	for (let round = 0; round < ROUNDS; round++) {
		for (const arm of ARMS) {
			const spec = loadJob('bench-load-' + arm);
			const { id } = await post(d.url + '/jobs', spec);
			await waitState(d, id, ['running'], 30000);
			const pages = [], stop = new AbortController(), clients = [], count = {};
			if (arm === 'requests' || arm.startsWith('requests:')) {
				/* requests:KIND picks the client per arm (requests:allseries,requests:page) */
				const kind = arm.startsWith('requests:') ? arm.slice(9) : CLIENT;
				for (let i = 0; i < PAGES; i++) clients.push(dashboardRequests(d, id, stop.signal, kind, count));
			} else if (arm === 'chromium') {
				for (let i = 0; i < PAGES; i++) {
					const p = await browser.newPage({ viewport: { width: 1280, height: 900 } });
					p.on('request', (r) => {
						if (!count.on) return;
						const u = r.url(), k = /\/events/.test(u) ? 'events' : /\/metrics/.test(u) ? 'metrics' : /\/checkpoints/.test(u) ? 'checkpoints'
							: /\/devices/.test(u) ? 'devices' : /\/jobs\/\d+$/.test(u) ? 'job' : 'other';
						count[k] = (count[k] || 0) + 1;
					});
					/* On a loaded machine a renderer can take long to start. */
					await p.goto(d.url + '/#/jobs/' + id, { timeout: 120000 });
					pages.push(p);
				}
				const t0 = Date.now();
				for (const [k, p] of pages.entries()) {
					try {
						await p.waitForFunction(() => Number((document.querySelector('[data-chart="0"]') || { dataset: {} }).dataset.points) > 0,
							null, { timeout: Math.max(1000, 60000 - (Date.now() - t0)) });
					} catch (e) { console.error(`round ${round}: page ${k} drew no chart within 60 s`); }
				}
				console.error(`round ${round}: ${PAGES} pages open, charts drawn after ${Date.now() - t0} ms`);
				if (PIN) pin([...browserCpu(new Set(daemons.map((x) => x.proc.pid))).keys()]);
			}
			await sleepMs(SETTLE * 1000);
			/* The renderers' own account of their time (CDP Performance
			 * metrics: script, layout, style, all tasks), to say where a
			 * page's CPU goes. */
			const cdp = [];
			for (const p of pages) {
				const c = await p.context().newCDPSession(p);
				await c.send('Performance.enable');
				cdp.push(c);
			}
			const perf = async () => {
				const sum = {};
				for (const c of cdp)
					for (const m of (await c.send('Performance.getMetrics')).metrics)
						if (/^(TaskDuration|ScriptDuration|LayoutDuration|RecalcStyleDuration)$/.test(m.name)) sum[m.name] = (sum[m.name] || 0) + m.value;
				return sum;
			};
			const p0 = await perf();
			const s0 = await jobStep(d, id), c0 = cpuSnap(d);
			for (const k of Object.keys(count)) delete count[k];
			count.on = true;
			await sleepMs(WINDOW * 1000);
			const s1 = await jobStep(d, id), c1 = cpuSnap(d);
			count.on = false;
			const p1 = await perf();
			for (const k of Object.keys(p1)) count[k.replace('Duration', '_ms_per_s_per_page')] = +((1000 * (p1[k] - p0[k])) / WINDOW / PAGES).toFixed(2);
			loads.push(os.loadavg()[0]);
			stop.abort();
			await Promise.allSettled(clients);
			for (const p of pages) await p.close();
			await post(d.url + '/jobs/' + id + '/cancel', {});
			const [w0, w1] = [await stepWall(d, id, s0), await stepWall(d, id, s1)];
			await waitState(d, id, ['cancelled', 'stopped', 'completed', 'failed'], 60000);
			const c = cpuDelta(c0, c1);
			const r = { rate: ((s1 - s0) * spec.batch_size) / (w1 - w0), steps: (s1 - s0) / (w1 - w0), ...c, count: { ...count } };
			delete r.count.on;
			res[arm].push(r);
			console.error(`round ${round} ${arm}: ${r.rate.toFixed(0)} samples/s over steps ${s0}..${s1} (${(w1 - w0).toFixed(1)} s);`
				+ ` CPU ms/s: daemon training ${c.train.toFixed(0)}, writer ${c.writer.toFixed(1)}, daemon other ${c.serve.toFixed(1)}, browser ${c.browser.toFixed(1)},`
				+ ` this process ${c.node.toFixed(1)}; load ${os.loadavg()[0].toFixed(1)}; ${JSON.stringify(r.count)}`);
		}
	}
	const med = (arm, f) => median(res[arm].map(f));
	out.push(`training: 1 CPU device, ${WINDOW} s windows after ${SETTLE} s settling, ${PAGES} pages or clients, ${ROUNDS} rounds,`
		+ ` job ${JOB}, client ${CLIENT}, browser and clients pinned: ${PIN || 'no'}, daemon pinned: ${PIN_DAEMON || 'no'}, load average ${median(loads).toFixed(1)} (${Math.min(...loads).toFixed(1)}-${Math.max(...loads).toFixed(1)}) on ${os.cpus().length} cores`);
	out.push('| arm | samples/s (median) | rounds | vs none | daemon training ms/s | metrics writer ms/s | writer µs/step | daemon HTTP and other ms/s (rounds) | browser ms/s | bench process ms/s | requests in last window |');
	out.push('|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|');
	const base = res.none ? med('none', (r) => r.rate) : NaN;
	for (const arm of ARMS) {
		const m = med(arm, (r) => r.rate);
		out.push(`| ${arm} | ${m.toFixed(0)} | ${res[arm].map((r) => r.rate.toFixed(0)).join(', ')} | ${(100 * (m / base - 1)).toFixed(1)}% |`
			+ ` ${med(arm, (r) => r.train).toFixed(0)} | ${med(arm, (r) => r.writer).toFixed(1)} | ${med(arm, (r) => (1000 * r.writer) / r.steps).toFixed(2)} | ${med(arm, (r) => r.serve).toFixed(1)} (${res[arm].map((r) => r.serve.toFixed(1)).join(', ')}) |`
			+ ` ${med(arm, (r) => r.browser).toFixed(1)} | ${med(arm, (r) => r.node).toFixed(1)} | ${JSON.stringify(res[arm][res[arm].length - 1].count)} |`);
	}
	if (res.none) {
		for (const arm of ARMS.filter((a) => a !== 'none')) {
			const serve = med(arm, (r) => r.serve) - med('none', (r) => r.serve);
			const client = arm === 'chromium' ? med(arm, (r) => r.browser) - med('none', (r) => r.browser) : med(arm, (r) => r.node) - med('none', (r) => r.node);
			/* The job's own CPU: its training threads and its metrics
			 * writer, in the arm without pages. */
			const jobCpu = med('none', (r) => r.train + r.writer);
			out.push(`${arm}: per page, daemon ${(serve / PAGES).toFixed(2)} ms CPU/s, ${arm === 'chromium' ? 'browser' : 'client'} ${(client / PAGES).toFixed(2)} ms CPU/s;`
				+ ` ${PAGES} pages' daemon CPU ${serve.toFixed(1)} ms/s = ${((100 * serve) / jobCpu).toFixed(2)}% of the job's ${jobCpu.toFixed(0)} ms/s`);
		}
	}
	stopDaemon(d);
}

/* C. Where a page's cost is on the daemon's side: with a job training,
 * the daemon's CPU time (all but the training threads and the metrics
 * writer) per request of each kind a page makes, over REQS sequential
 * requests; and per second of five event streams, whole or types=state,log. */
async function requestCosts(out) {
	const d = await startDaemon(1);
	const { id } = await post(d.url + '/jobs', job('bench-requests', 1e9, 1));
	await waitState(d, id, ['running'], 30000);
	await sleepMs(3000);
	const REQS = Number(opt('--reqs', 200));
	const other = () => daemonCpu(d.proc.pid).serve;
	out.push('| request | daemon CPU per request (ms) | answer bytes (mean) |');
	out.push('|---|---:|---:|');
	const kinds = [
		['metrics, 1 s of new steps, max_points=16 (an hour-old job)', async () => `/jobs/${id}/metrics?max_points=16&epochs=true&times=true&from_step=${Math.max(0, (await jobStep(d, id)) - 5000)}`],
		['metrics, 1 s of new steps, max_points=200', async () => `/jobs/${id}/metrics?max_points=200&epochs=true&times=true&from_step=${Math.max(0, (await jobStep(d, id)) - 5000)}`],
		['metrics, 1 s of new steps, max_points=2000 (before)', async () => `/jobs/${id}/metrics?max_points=2000&epochs=true&times=true&from_step=${Math.max(0, (await jobStep(d, id)) - 5000)}`],
		['job', async () => `/jobs/${id}`],
		['checkpoints', async () => `/jobs/${id}/checkpoints`],
		['devices', async () => '/devices'],
	];
	for (const [name, url] of kinds) {
		const urls = [];
		for (let i = 0; i < REQS; i++) urls.push(await url());
		let bytes = 0;
		const c0 = other();
		for (const u of urls) bytes += (await (await fetch(d.url + u)).text()).length;
		out.push(`| ${name} | ${((other() - c0) / REQS).toFixed(3)} | ${(bytes / REQS).toFixed(0)} |`);
	}
	for (const q of ['', '?types=state,log']) {
		const stop = new AbortController();
		let bytes = 0;
		const streams = [];
		for (let i = 0; i < 5; i++)
			streams.push(fetch(d.url + `/jobs/${id}/events` + q, { signal: stop.signal }).then(async (r) => {
				const reader = r.body.getReader();
				for (;;) { const { done, value } = await reader.read(); if (done) break; bytes += value.length; }
			}).catch(() => {}));
		await sleepMs(3000); /* the history first */
		const c0 = other(), b0 = bytes, t0 = performance.now();
		await sleepMs(10000);
		const sec = (performance.now() - t0) / 1000;
		out.push(`| 5 event streams${q} | ${((other() - c0) / sec).toFixed(1)} ms/s | ${((bytes - b0) / sec / 5).toFixed(0)} B/s each |`);
		stop.abort();
		await Promise.allSettled(streams);
	}
	await post(d.url + '/jobs/' + id + '/cancel', {});
	out.push(`load average ${os.loadavg()[0].toFixed(1)} on ${os.cpus().length} cores`);
	stopDaemon(d);
}

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
	args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage'] });
const out = [];
try {
	if (ONLY !== 'load' && ONLY !== 'requests') {
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
	if (ONLY === 'requests') await requestCosts(out);
	else if (ONLY !== 'open') await loadBench(out);
} finally {
	await browser.close();
}
console.log(out.join('\n'));
setTimeout(() => process.exit(0), 3500);
