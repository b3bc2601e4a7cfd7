// Browser test of the dashboard (GET /): Debian's chromium driven by
// playwright-core (scripts/install-deps.sh installs both), against real
// daemons on loopback training real jobs on synthetic data.
//
// Checks: the jobs page lists a running job; the job page's loss chart
// gains points while it trains and its log tail grows; a drag on the chart
// refetches that step range (from_step/to_step); Stop, after confirmation,
// stops the job and the page shows it; when a page shows a job stopped,
// cancelled, failed or completed, its curves already reach the job's final
// step; info keys named like Object.prototype's members show as
// themselves; the submit form shows each of a bad spec's
// errors at its JSON pointer; the device panel shows the loader threads the
// daemon says the job runs with, and for an ended job the devices it ran on
// without the memory figures of whoever holds them now; a page of another
// origin cannot pause or cancel a job, and a rebinding name gets 403; with a token configured the page asks for it
// once, keeps it out of every URL, and works; on a phone no field of the
// jobs and devices tables is off the screen; a series of one point is
// drawn; the submit form's Preemptible box submits a preemptible job, and
// once a higher-priority job preempts it its badge names who, with why.  Screenshots of each page go to ARTIFACT_DIR.
//
// Usage: node tests/browser/test_dashboard.mjs TRAINERD ARTIFACT_DIR
// Prints "RESULT: N passed, M failed".  Bounded: each wait has a timeout
// and the whole run is killed after 240 s.
import { chromium } from 'playwright-core';
import http from 'node:http';
import path from 'node:path';
import { browserTest, waitFor } from './lib.mjs';

const t0 = browserTest('test_dashboard', 240000);
const { artifacts, check, step } = t0;
const startDaemon = t0.startDaemon, finish = t0.finish;
const TOKEN = 'dashboard-test-token';
let browser = null;

async function submit(d, spec, token) {
	const headers = { 'Content-Type': 'application/json' };
	if (token) headers.Authorization = 'Bearer ' + token;
	const r = await fetch(d.url + '/jobs', { method: 'POST', headers, body: JSON.stringify(spec) });
	if (r.status !== 201) throw new Error('submit: HTTP ' + r.status + ' ' + (await r.text()));
	return (await r.json()).id;
}
async function jobState(d, id, token) {
	const r = await fetch(d.url + '/jobs/' + id, { headers: token ? { Authorization: 'Bearer ' + token } : {} });
	return (await r.json()).state;
}

/* Long enough to watch (the test stops it); checkpoints every 40 steps
 * make log lines and downloads appear while it trains (keep 10: a listed
 * one is not pruned before the test downloads it). */
const longJob = {
	name: 'browser-long', seed: 3,
	model: { inputs: 32, layers: [{ type: 'dense', units: 64 }, { type: 'relu' }, { type: 'dense', units: 4 }],
		loss: 'softmax_cross_entropy' },
	data: { train: { format: 'synthetic', task: 'classification', samples: 4096, features: 32, classes: 4,
		noise: 1.0, load_cost_us: 300 }, validation_split: 0.1 },
	batch_size: 64, max_steps: 200000, optimizer: { type: 'adamw', lr: 0.002 },
	devices: 2, checkpoint: { every_steps: 40, keep: 10 },
};
const shortJob = { ...longJob, name: 'browser-short', max_steps: 60, checkpoint: { every_steps: 30, keep: 2 } };

const chartPoints = (page) => page.$eval('[data-chart="0"]', (el) => Number(el.dataset.points));
const logLines = (page) => page.$eval('#job-log', (el) => el.childNodes.length);
/* From now on, records what the page shows at the moment its state badge
 * first shows an end: the state, the step in the info panel, and each
 * chart's last step of each of this job's lines (data-last-steps). */
async function watchEnd(page) {
	await page.evaluate((ended) => {
		window.endSeen = null;
		const box = document.querySelector('#job-state');
		const look = () => {
			const b = box.querySelector('[data-state]');
			if (window.endSeen || !b || !ended.includes(b.dataset.state)) return;
			window.endSeen = { state: b.dataset.state, step: document.querySelector('#job-info dd').textContent,
				charts: [...document.querySelectorAll('[data-chart]')].map((el) => JSON.parse(el.dataset.lastSteps || '{}')) };
		};
		new MutationObserver(look).observe(box, { childList: true, subtree: true });
		look();
	}, ['stopped', 'completed', 'failed', 'cancelled']);
}
/* When the page showed the job ended (watchEnd), every line of it ended
 * at the series' last step in the daemon, and the loss at the job's final
 * step: the newest value is never missing. */
async function checkEnd(page, d, id, want) {
	await page.waitForFunction(() => window.endSeen, null, { timeout: 60000 });
	const seen = await page.evaluate(() => window.endSeen);
	if (seen.state !== want) throw new Error('the page showed ' + seen.state);
	const final = Number(seen.step.split('/')[0]);
	const job = await (await fetch(d.url + '/jobs/' + id)).json();
	if (!(final > 0) || final !== job.progress.step) throw new Error('step shown ' + seen.step + ', the daemon\'s ' + job.progress.step);
	if (!seen.charts.length || seen.charts[0].loss === undefined) throw new Error('no loss chart when the page showed ' + want);
	for (const chart of seen.charts) {
		for (const [name, last] of Object.entries(chart)) {
			const r = await (await fetch(d.url + '/jobs/' + id + '/metrics?names=' + name + '&max_points=2')).json();
			const steps = r.series[name].steps;
			if (last !== steps[steps.length - 1])
				throw new Error(`${name} ended at step ${last} when the page showed ${want}; its last step is ${steps[steps.length - 1]}`);
		}
	}
	if (seen.charts[0].loss !== final) throw new Error(`the loss ended at step ${seen.charts[0].loss}, the job at ${final}`);
}

try {
	browser = t0.browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
		args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage',
			'--host-resolver-rules=MAP rebind.example 127.0.0.1'] });

	// ---- daemon without a token ----
	// Four devices: the long job and one submitted from the page both run.
	const d = await startDaemon(4, []);
	const id = await submit(d, longJob);
	await waitFor('job running', async () => (await jobState(d, id)) === 'running', 30000);

	const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
	const page = await context.newPage();
	const pageErrors = [];
	page.on('pageerror', (e) => pageErrors.push(e.message));
	const urls = [];
	page.on('request', (r) => urls.push(r.url()));
	/* Nothing the page asks for is missing (a browser asks for
	 * /favicon.ico unless the page names its icon). */
	const missing = [];
	page.on('response', (r) => { if (r.status() === 404) missing.push(r.url()); });

	await step('jobs page lists the running job', async () => {
		await page.goto(d.url + '/');
		await page.waitForSelector(`tr[data-job="${id}"] [data-state="running"]`, { timeout: 15000 });
		const name = await page.textContent(`tr[data-job="${id}"] a`);
		if (!name.includes('browser-long')) throw new Error('row shows ' + name);
		await page.waitForFunction((jid) => {
			const p = document.querySelector(`tr[data-job="${jid}"] progress`);
			return p && p.value > 0;
		}, id, { timeout: 15000 });
		await page.screenshot({ path: path.join(artifacts, 'jobs.png'), fullPage: true });
	});

	await step('submit form shows each of a bad spec\'s errors at its pointer', async () => {
		await page.click('#submit summary');
		const bad = JSON.stringify({ ...shortJob, optimizer: { type: 'adamw', lr: -1 }, prefetch: { workers: 0 } }, null, 2);
		await page.fill('#spec-text', bad);
		await page.click('#submit-btn');
		await page.waitForSelector('[data-testid="spec-error"]', { timeout: 10000 });
		const pointer = await page.textContent('[data-testid="spec-pointer"]');
		if (pointer !== '/optimizer/lr') throw new Error('pointer shown: ' + pointer);
		const marked = await page.textContent('[data-testid="spec-excerpt"] mark');
		if (!marked.startsWith('"lr"')) throw new Error('marked text: ' + marked);
		const sel = await page.$eval('#spec-text', (t) => t.value.slice(t.selectionStart, t.selectionEnd));
		if (!sel.startsWith('"lr"')) throw new Error('selected text: ' + sel);
		/* Both problems, each with its pointer and its own excerpt. */
		const problems = await page.$$eval('[data-testid="spec-problem"]', (els) => els.map((e) => ({
			pointer: e.querySelector('[data-testid="spec-pointer"]')?.textContent,
			mark: e.querySelector('[data-testid="spec-excerpt"] mark')?.textContent || '' })));
		if (JSON.stringify(problems.map((p) => p.pointer)) !== '["/optimizer/lr","/prefetch/workers"]')
			throw new Error('problems shown: ' + JSON.stringify(problems));
		if (!problems[1].mark.startsWith('"workers"')) throw new Error('second excerpt marks: ' + problems[1].mark);
		await page.screenshot({ path: path.join(artifacts, 'submit-error.png'), fullPage: true });
	});

	let shortId = 0;
	await step('submit form submits a good spec and opens its page', async () => {
		await page.fill('#spec-text', JSON.stringify(shortJob, null, 2));
		await page.click('#submit-btn');
		await page.waitForURL(/#\/jobs\/\d+$/, { timeout: 10000 });
		shortId = Number(/(\d+)$/.exec(page.url())[1]);
		await page.waitForSelector('#job-title', { timeout: 10000 });
	});

	await step('job page: the loss chart gains points while the job trains', async () => {
		await page.goto(d.url + '/#/jobs/' + id);
		await page.waitForSelector('[data-chart="0"] canvas', { timeout: 15000 });
		await waitFor('points in the chart', async () => (await chartPoints(page)) > 0, 15000);
		const n0 = await chartPoints(page);
		const chips = await page.textContent('[data-chart="0"]').catch(() => '');
		await waitFor('more points', async () => (await chartPoints(page)) > n0, 20000);
		const names = await page.$$eval('.chart-card .chip', (els) => els.map((e) => e.textContent));
		if (!names.some((n) => n.startsWith('loss'))) throw new Error('chart lines: ' + names.join(', ') + chips);
	});

	await step('job page: the log tail updates', async () => {
		await waitFor('log lines', async () => (await logLines(page)) > 0, 15000);
		const n0 = await logLines(page);
		await waitFor('a new log line', async () => (await logLines(page)) > n0, 30000);
	});

	await step('job page: metrics are polled incrementally', async () => {
		const polls = urls.filter((u) => u.includes(`/jobs/${id}/metrics`));
		if (polls.length < 2) throw new Error('only ' + polls.length + ' metrics requests');
		const later = polls.slice(1);
		if (!later.every((u) => /from_step=[1-9]/.test(u) || /to_step=/.test(u)))
			throw new Error('a later poll read from the start: ' + later.find((u) => !/from_step=[1-9]/.test(u)));
		/* New steps come downsampled, and the event stream leaves out the
		 * raw points (bench/dashboard/RESULTS.md, section B). */
		const incr = later.filter((u) => !/to_step=/.test(u));
		if (!incr.length || !incr.every((u) => Number(new URL(u).searchParams.get('max_points')) <= 200))
			throw new Error('incremental polls: ' + incr.slice(0, 3).join(' '));
		const streams = urls.filter((u) => u.includes(`/jobs/${id}/events`));
		if (!streams.length || !streams.every((u) => new URL(u).searchParams.get('types') === 'state,log'))
			throw new Error('event streams: ' + streams.join(' '));
	});

	await step('job page: each second only the charted series are read; one put on a chart catches up', async () => {
		/* A fresh page: the catch-up must not wait for the page's first
		 * ten seconds to pass. */
		await page.reload();
		await page.waitForSelector('[data-chart="0"] canvas', { timeout: 15000 });
		await waitFor('points in the chart', async () => (await chartPoints(page)) > 0, 15000);
		const from = urls.length;
		await new Promise((r) => setTimeout(r, 3500));
		const polls = urls.slice(from).map((u) => new URL(u))
			.filter((u) => u.pathname === `/jobs/${id}/metrics` && !u.searchParams.get('to_step'));
		const named = polls.filter((u) => u.searchParams.get('names'));
		if (named.length < 2) throw new Error(named.length + ' polls of the charted series in 3.5 s: ' + polls.join(' '));
		const off = named.find((u) => !u.searchParams.get('names').split(',').every((n) => n === 'loss' || n === 'val_loss'));
		if (off) throw new Error('a poll read series on no chart: ' + off);
		if (polls.length - named.length > 1) throw new Error('every series was read ' + (polls.length - named.length) + ' times in 3.5 s');
		/* Put step_ms (read only every 10 s so far) on the chart: it is
		 * read at once from where it was, and its line reaches the loss's
		 * newest step. */
		const at = urls.length;
		await page.selectOption('.chart-card:has([data-chart="0"]) select', 'step_ms');
		const polled = () => urls.slice(at).map((u) => new URL(u))
			.filter((q) => q.pathname === `/jobs/${id}/metrics` && !q.searchParams.get('to_step'));
		await waitFor('a read after the series was put on the chart', async () => polled().length > 0, 5000);
		if (polled()[0].searchParams.get('names')) throw new Error('the first read after it was of the charted series only: ' + polled()[0]);
		const lastX = (label) => page.$eval('[data-chart="0"]', (el, want) => {
			const k = el.uplot.series.findIndex((s) => s.label === want || s.label === want + ' (raw)');
			if (k < 0) return -1;
			const xs = el.uplot.data[0], ys = el.uplot.data[k];
			for (let i = xs.length - 1; i >= 0; i--) if (ys[i] !== null && ys[i] !== undefined) return xs[i];
			return -1;
		}, label);
		await waitFor('step_ms drawn to the newest step', async () => {
			const [loss, added] = [await lastX('loss'), await lastX('step_ms')];
			return added >= 0 && loss - added <= 200;
		}, 5000);
	});

	await step('job page: info and device labels say what they show', async () => {
		const labels = await page.$$eval('#job-info dt, #job-devices dt', (els) => els.map((e) => e.textContent));
		for (const want of ['Current epoch', 'Data wait (ms/step)', 'Data-wait share'])
			if (!labels.includes(want)) throw new Error('no "' + want + '" in ' + labels.join(', '));
		/* The engine's "epoch" info field (last finished) is not shown
		 * under a bare name that reads like the current one. */
		if (labels.includes('epoch') || labels.includes('Epoch')) throw new Error('ambiguous epoch label: ' + labels.join(', '));
		/* The routes are the device panel's, named there, not listed
		 * again under their raw keys. */
		if (!labels.includes('Dense routes')) throw new Error('no "Dense routes" in ' + labels.join(', '));
		const infoLabels = await page.$$eval('#job-info dt', (els) => els.map((e) => e.textContent));
		for (const raw of ['dense_routes', 'conv_routes'])
			if (infoLabels.includes(raw)) throw new Error(raw + ' listed raw in the info panel: ' + infoLabels.join(', '));
		/* Keys that name Object.prototype's members show as themselves,
		 * not as the text of a function found there. */
		const tricky = ['constructor', '__proto__', 'toString'];
		const r = await fetch(d.url + '/jobs/' + id + '/info', { method: 'PUT', headers: { 'Content-Type': 'application/json' },
			body: '{"constructor": "c", "__proto__": "p", "toString": "t"}' });
		if (r.status !== 200) throw new Error('PUT info: HTTP ' + r.status + ' ' + (await r.text()));
		await waitFor('the info keys on the page', async () => {
			const now = await page.$$eval('#job-info dt', (els) => els.map((e) => e.textContent));
			return tricky.every((k) => now.includes(k));
		}, 10000).catch(async () => {
			throw new Error('labels: ' + (await page.$$eval('#job-info dt', (els) => els.map((e) => e.textContent))).join(' | '));
		});
	});

	await step('job page: device panel shows the loader threads the job runs with, and its devices\' memory', async () => {
		/* The spec leaves prefetch.workers to its default: the daemon
		 * says what the trainer resolved. */
		await waitFor('loader threads', async () =>
			(await page.textContent('#job-devices dd[data-key="loader_threads"]').catch(() => '')) === '2', 15000);
		const devs = await page.$$eval('#job-devices dd[data-device]', (els) => els.map((e) => e.textContent));
		if (devs.length !== longJob.devices || !devs.every((t) => / used$/.test(t)))
			throw new Error('devices shown: ' + devs.join('; '));
	});

	await step('job page: drag to zoom refetches that step range', async () => {
		const over = await page.$('[data-chart="0"] .u-over');
		const box = await over.boundingBox();
		const req = page.waitForRequest((r) => /\/metrics\?.*from_step=\d+.*to_step=\d+/.test(r.url()), { timeout: 10000 });
		await page.mouse.move(box.x + box.width * 0.3, box.y + box.height / 2);
		await page.mouse.down();
		await page.mouse.move(box.x + box.width * 0.5, box.y + box.height / 2, { steps: 5 });
		await page.mouse.move(box.x + box.width * 0.7, box.y + box.height / 2, { steps: 5 });
		await page.mouse.up();
		const r = await req;
		const q = new URL(r.url()).searchParams;
		if (!(Number(q.get('to_step')) > Number(q.get('from_step')))) throw new Error('range ' + r.url());
		await page.waitForSelector('.reset-zoom:not([hidden])', { timeout: 10000 });
		await page.screenshot({ path: path.join(artifacts, 'job-zoomed.png'), fullPage: true });
		await page.click('.reset-zoom');
	});

	await step('job page: x by epoch and wall time, log y, smoothing, another chart, another job', async () => {
		await page.selectOption('#x-axis', 'epoch');
		/* The job is bounded by max_steps (no epoch count): each point
		 * still gets its own x, a fraction of an epoch, rising with its
		 * step (not every point of an epoch at one whole number). */
		const [xs, epoch] = await Promise.all([page.$eval('[data-chart="0"]', (el) => Array.from(el.uplot.data[0])),
			fetch(d.url + '/jobs/' + id).then((r) => r.json()).then((j) => j.progress.epoch)]);
		if (xs.length < 100 || !xs.every((x, i) => i === 0 || x > xs[i - 1]))
			throw new Error('x by epoch: ' + xs.length + ' points, not all rising: ' + JSON.stringify(xs.slice(0, 8)));
		if (!(xs[xs.length - 1] > epoch - 2 && xs[xs.length - 1] < epoch + 2))
			throw new Error('x by epoch ends at ' + xs[xs.length - 1] + ', the job is in epoch ' + epoch);
		const spe = await page.evaluate(() => trainerdDashboard.epochLength({
			a: { steps: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], epochs: [0, 0, 0, 1, 1, 1, 2, 2, 2, 3] },
			b: { steps: [3, 6], epochs: [0, 1] } }));
		if (spe !== 3) throw new Error('epochLength gave ' + spe);
		await page.selectOption('#x-axis', 'time');
		await page.selectOption('#y-scale', 'log');
		await page.fill('#smoothing', '0');
		await page.selectOption('#add-chart', 'lr');
		await page.waitForSelector('[data-chart="1"] canvas', { timeout: 5000 });
		await page.fill('#overlay-job', String(shortId));
		await page.click('#overlay-add');
		await page.waitForSelector(`#overlay-chips .chip`, { timeout: 10000 });
		await waitFor('the other job\'s loss line', async () =>
			(await page.textContent('.chart-card')).includes('#' + shortId + ' loss'), 10000);
		await page.screenshot({ path: path.join(artifacts, 'job-controls.png'), fullPage: true });
		await page.selectOption('#x-axis', 'step');
		await page.selectOption('#y-scale', 'linear');
		await page.fill('#smoothing', '0.6');
	});

	await step('smoothing is TensorBoard\'s debiased EMA; pointers map to their text', async () => {
		const got = await page.evaluate(() => trainerdDashboard.ema([1, 2, NaN, 4, 8], 0.5));
		/* By hand: last = 0.5, 1.25, (skip), 2.625, 5.3125; debias 1 - 0.5^n for n = 1, 2, 3, 4. */
		const want = [1, 1.25 / 0.75, NaN, 2.625 / 0.875, 5.3125 / 0.9375];
		if (!got.every((v, i) => (Number.isNaN(want[i]) ? v === null || Number.isNaN(v) : Math.abs(v - want[i]) < 1e-12)))
			throw new Error('ema gave ' + JSON.stringify(got));
		/* Halving a series: first point alone, then pairs as one bucket
		 * (the later point, the pair's min and max), an odd last alone. */
		const halved = await page.evaluate(() => {
			const s = { steps: [0, 1, 2, 3, 4, 5], values: [5, 4, 9, 2, 1, 3], epochs: [0, 0, 0, 1, 1, 1], times: [10, 11, 12, 13, 14, 15],
				min: [5, 4, 8, 2, 1, 3], max: [5, 4, 9, 7, 1, 3] };
			trainerdDashboard.compact(s);
			return s;
		});
		const wantHalved = { steps: [0, 2, 4, 5], values: [5, 9, 1, 3], epochs: [0, 0, 1, 1], times: [10, 12, 14, 15],
			min: [5, 4, 1, 3], max: [5, 9, 7, 3] };
		if (JSON.stringify(halved) !== JSON.stringify(wantHalved)) throw new Error('compact gave ' + JSON.stringify(halved));
		/* The page's join of chart tables against uPlot's own. */
		const joined = await page.evaluate(() => {
			const tables = [[[1, 3, 5, 8], [10, 30, 50, 80]], [[2, 3, 6], [20, 33, 60], [0, 1, 2]], [[0.5, 8], [7, 9]]];
			const a = trainerdDashboard.joinTables(tables), b = uPlot.join(tables);
			return [JSON.stringify(a), JSON.stringify(b)];
		});
		if (joined[0] !== joined[1]) throw new Error('joinTables gave ' + joined[0] + ', uPlot.join ' + joined[1]);
		const where = await page.evaluate(() => {
			const text = '{"a": [1, {"b/c": 2, "d~e": "x"}], "f": null}';
			const m = trainerdDashboard.pointerMap(text);
			return ['/a/1/b~1c', '/a/1/d~0e', '/f', '/a/0'].map((p) => text.slice(...m.get(p)));
		});
		if (JSON.stringify(where) !== JSON.stringify(['"b/c": 2', '"d~e": "x"', '"f": null', '1']))
			throw new Error('pointerMap gave ' + JSON.stringify(where));
	});

	await step('job page: checkpoints listed with download links', async () => {
		await page.waitForSelector('#job-checkpoints a[href$="model.safetensors"]', { timeout: 20000 });
		/* The newest listed one; on a very slow machine the list may lag
		 * behind pruning, so look again a few times. */
		let status = 0, href = '';
		for (let tries = 0; tries < 5 && status !== 200; tries++) {
			if (tries) await new Promise((r) => setTimeout(r, 2000));
			href = await page.getAttribute('#job-checkpoints a[href$="model.safetensors"]', 'href');
			status = (await fetch(d.url + href)).status;
		}
		if (status !== 200) throw new Error('download ' + href + ': HTTP ' + status);
	});

	await step('job page screenshot (laptop and phone)', async () => {
		await page.screenshot({ path: path.join(artifacts, 'job.png'), fullPage: true });
		/* The phone in the dark scheme, so both themes get looked at. */
		const phone = await browser.newPage({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, colorScheme: 'dark' });
		await phone.goto(d.url + '/#/jobs/' + id);
		await phone.waitForSelector('[data-chart="0"] canvas', { timeout: 15000 });
		const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
		/* One column: the info comes right after the charts, before the log. */
		const [infoTop, logTop] = await phone.evaluate(() => ['#job-info', '#job-log'].map((s) => document.querySelector(s).getBoundingClientRect().top));
		await phone.screenshot({ path: path.join(artifacts, 'job-phone.png'), fullPage: true });
		await phone.close();
		if (overflow > 0) throw new Error('the page is ' + overflow + ' px wider than a phone screen');
		if (!(infoTop < logTop)) throw new Error('the info is below the log on a phone (' + infoTop + ' px, the log ' + logTop + ' px)');
	});

	await step('phone: every field of the jobs and devices tables is on the screen', async () => {
		const phone = await browser.newPage({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2 });
		const offScreen = (sel) => phone.$$eval(sel, (cells) => cells.filter((c) => {
			const r = c.getBoundingClientRect();
			return r.width === 0 || r.left < 0 || r.right > window.innerWidth;
		}).map((c) => c.dataset.label || c.textContent));
		await phone.goto(d.url + '/');
		await phone.waitForSelector(`tr[data-job="${id}"] [data-state="running"]`, { timeout: 15000 });
		const jobCells = await offScreen(`tr[data-job="${id}"] td`);
		await phone.screenshot({ path: path.join(artifacts, 'jobs-phone.png'), fullPage: true });
		await phone.goto(d.url + '/#/devices');
		await phone.waitForSelector(`#devices-table a[href="#/jobs/${id}"]`, { timeout: 10000 });
		const devCells = await offScreen('#devices-table td');
		await phone.screenshot({ path: path.join(artifacts, 'devices-phone.png'), fullPage: true });
		await phone.close();
		if (jobCells.length || devCells.length)
			throw new Error('off the screen: jobs ' + jobCells.join(', ') + '; devices ' + devCells.join(', '));
	});

	await step('devices page shows which job owns each device', async () => {
		const dev = await context.newPage();
		await dev.goto(d.url + '/#/devices');
		await dev.waitForSelector(`#devices-table tr[data-device="1"] a[href="#/jobs/${id}"]`, { timeout: 10000 });
		await dev.screenshot({ path: path.join(artifacts, 'devices.png'), fullPage: true });
		await dev.close();
	});

	/* A page of another origin (a server of this test on another port)
	 * tries a no-cors fetch and an auto-submitted form, both POSTs without
	 * a body: refused (403), the job runs on.  A name of the attacker's
	 * that resolves to loopback (DNS rebinding, made with the browser's
	 * host resolver rules) gets 403 too.  The dashboard's own POSTs
	 * (submit above, Stop below) still work. */
	await step('a page of another origin cannot pause or cancel a job; a rebinding name gets 403', async () => {
		const evil = http.createServer((req, res) => {
			res.writeHead(200, { 'Content-Type': 'text/html' });
			res.end(`<!doctype html><iframe name="sink"></iframe>
<form id="f" method="POST" action="${d.url}/jobs/${id}/cancel" target="sink"></form>
<script>
window.fetched = fetch('${d.url}/jobs/${id}/pause', { method: 'POST', mode: 'no-cors' })
	.then(() => 'sent', (e) => 'error ' + e);
document.getElementById('f').submit();
</script>`);
		});
		await new Promise((r) => evil.listen(0, '127.0.0.1', r));
		const cross = await context.newPage();
		const refusals = [];
		cross.on('response', (r) => { if (r.url().startsWith(d.url + '/jobs/')) refusals.push(r.status()); });
		try {
			await cross.goto(`http://127.0.0.1:${evil.address().port}/`);
			await cross.evaluate(() => window.fetched);
			await waitFor('both requests answered', async () => refusals.length >= 2, 10000);
			if (refusals.some((s) => s !== 403)) throw new Error('answers: ' + refusals.join(', '));
			await new Promise((r) => setTimeout(r, 500));
			const state = await jobState(d, id);
			if (state !== 'running') throw new Error('the job is ' + state + ' after the other origin\'s POSTs');
			const port = new URL(d.url).port;
			const r = await cross.goto(`http://rebind.example:${port}/jobs`);
			if (r.status() !== 403) throw new Error('a rebinding name got HTTP ' + r.status());
		} finally {
			await cross.close();
			evil.close();
		}
	});

	await step('Stop asks for confirmation, stops the job, and the page shows it', async () => {
		await page.focus('#btn-stop');
		await page.keyboard.press('Enter');
		await page.waitForSelector('#confirm-dialog[open]', { timeout: 5000 });
		/* Feedback comes at once and may be gone again as soon as the job
		 * has stopped: record every text it shows. */
		await page.evaluate(() => {
			const fb = document.querySelector('#job-feedback');
			window.feedbackSeen = [];
			new MutationObserver(() => window.feedbackSeen.push(fb.textContent))
				.observe(fb, { childList: true, characterData: true, subtree: true });
		});
		await watchEnd(page);
		await page.click('#confirm-ok');
		await page.waitForFunction(() => window.feedbackSeen.some((t) => /stop/.test(t)), null, { timeout: 5000 });
		await page.waitForSelector('#job-state [data-state="stopped"]', { timeout: 60000 });
		await checkEnd(page, d, id, 'stopped');
		/* The toast of the request ("… is stopping") gives way to the
		 * state the job reached. */
		await page.waitForFunction(() => /is stopped/.test(document.querySelector('#toast').textContent), null, { timeout: 5000 })
			.catch(async () => { throw new Error('the toast says: ' + (await page.textContent('#toast'))); });
		if ((await jobState(d, id)) !== 'stopped') throw new Error('the daemon says ' + (await jobState(d, id)));
		const step = Number((await page.textContent('#job-info dd')).split('/')[0]);
		if (!(step > 0 && step < longJob.max_steps)) throw new Error('step shown: ' + step);
		if (!(await page.isDisabled('#btn-stop'))) throw new Error('Stop is still enabled');
		/* A stopped job can be resumed later. */
		if (await page.isDisabled('#btn-resume')) throw new Error('Resume is disabled for a stopped job');
		if (await page.isDisabled('#resume-epochs')) throw new Error('the epochs of a resume cannot be given');
	});

	await step('stopped: the device panel lists the devices it ran on, without today\'s memory', async () => {
		await page.waitForFunction(() => [...document.querySelectorAll('#job-devices dt')].some((e) => e.textContent === 'Ran on'),
			null, { timeout: 15000 });
		const devs = await page.$$eval('#job-devices dd[data-device]', (els) => els.map((e) => e.dataset.device + ' ' + e.textContent));
		if (devs.length !== longJob.devices || devs.some((t) => /used|B\b/.test(t))) throw new Error('devices shown: ' + devs.join('; '));
		const threads = await page.textContent('#job-devices dd[data-key="loader_threads"]');
		if (threads !== '2') throw new Error('loader threads shown: ' + threads);
		await page.screenshot({ path: path.join(artifacts, 'job-stopped.png'), fullPage: true });
	});

	/* The other ends, each watched live: a running job cancelled from its
	 * page; then, on pages opened while they waited for its devices, one
	 * that fails (its loss turns NaN at step 2) and one that completes. */
	const ends = {};
	await step('cancelled: the curves reach the final step when the page shows it', async () => {
		const cid = await submit(d, { ...longJob, name: 'browser-cancel', devices: 4 });
		await waitFor('job running', async () => (await jobState(d, cid)) === 'running', 30000);
		ends.failed = await submit(d, { ...shortJob, name: 'browser-nan', optimizer: { type: 'sgd', lr: 1e30 } });
		ends.completed = await submit(d, { ...shortJob, name: 'browser-complete', max_steps: 150 });
		ends.pages = [];
		const open = async (jid) => {
			const p = await context.newPage();
			ends.pages.push(p);
			p.on('pageerror', (e) => pageErrors.push(e.message));
			await p.goto(d.url + '/#/jobs/' + jid);
			await p.waitForSelector('#job-state [data-state]', { timeout: 10000 });
			await watchEnd(p);
			return p;
		};
		const pc = await open(cid);
		ends.failedPage = await open(ends.failed);
		ends.completedPage = await open(ends.completed);
		await waitFor('points in the chart', async () => (await chartPoints(pc)) > 0, 15000);
		await pc.click('#btn-cancel');
		await pc.waitForSelector('#confirm-dialog[open]', { timeout: 5000 });
		await pc.click('#confirm-ok');
		await checkEnd(pc, d, cid, 'cancelled');
	});
	await step('failed: the curves reach the final step when the page shows it', async () => {
		await checkEnd(ends.failedPage, d, ends.failed, 'failed');
	});
	await step('failed: a loss of one point is drawn', async () => {
		/* The job has one loss point (step 1): pixels of the loss's
		 * colour (the first of the palette, #2563eb) in its chart. */
		const n = await ends.failedPage.$eval('[data-chart="0"] canvas', (cv) => {
			const px = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
			let hits = 0;
			for (let i = 0; i < px.length; i += 4)
				if (Math.abs(px[i] - 0x25) < 40 && Math.abs(px[i + 1] - 0x63) < 40 && Math.abs(px[i + 2] - 0xeb) < 40 && px[i + 3] > 200) hits++;
			return hits;
		});
		await ends.failedPage.screenshot({ path: path.join(artifacts, 'job-failed.png'), fullPage: true });
		if (n < 10) throw new Error(n + ' pixels of the loss colour in the chart');
	});
	await step('completed: the curves reach the final step when the page shows it', async () => {
		await checkEnd(ends.completedPage, d, ends.completed, 'completed');
		await ends.completedPage.screenshot({ path: path.join(artifacts, 'job-completed.png'), fullPage: true });
	});
	for (const p of ends.pages || []) await p.close();

	await step('a finished regression job: whole-run figures, no accuracy row, short series unsmoothed, waits in ms', async () => {
		const rid = await submit(d, { name: 'browser-regression', seed: 2,
			model: { inputs: 5, layers: [{ type: 'dense', units: 8 }, { type: 'relu' }, { type: 'dense', units: 1 }], loss: 'mse' },
			data: { train: { format: 'synthetic', task: 'regression', samples: 300, features: 5 }, validation_split: 0.2 },
			batch_size: 64, epochs: 6, optimizer: { type: 'adam', lr: 0.01 } });
		await waitFor('the regression job completed', async () => (await jobState(d, rid)) === 'completed', 30000);
		const job = await (await fetch(d.url + '/jobs/' + rid)).json();
		const want = job.summary.epoch_loss.toFixed(4);
		const rp = await context.newPage();
		await rp.goto(d.url + '/#/jobs/' + rid);
		await rp.waitForSelector('#job-info dt', { timeout: 15000 });
		await waitFor('the chart drawn', async () => (await rp.$eval('[data-chart="0"]', (el) => Number(el.dataset.points)).catch(() => 0)) > 0, 10000);
		const info = await rp.$$eval('#job-info dt', (els) => Object.fromEntries(els.map((e) => [e.textContent, e.nextElementSibling.textContent])));
		await rp.screenshot({ path: path.join(artifacts, 'job-regression.png'), fullPage: true });
		if ('Val accuracy' in info) throw new Error('a regression job shows "Val accuracy": ' + JSON.stringify(info));
		/* Its training time (progress.elapsed_s, every run's), not its wall span. */
		if (!(job.progress.elapsed_s > 0)) throw new Error('no progress.elapsed_s: ' + JSON.stringify(job.progress));
		const el = await rp.evaluate((v) => { const s = Math.max(0, Math.round(v)); return s < 60 ? s + 's' : null; }, job.progress.elapsed_s);
		if (el && info['Elapsed'] !== el) throw new Error('Elapsed shows ' + info['Elapsed'] + ', the job trained ' + el);
		if (info['Epoch loss (mean)'] !== want) throw new Error('epoch loss ' + info['Epoch loss (mean)'] + ', the summary\'s ' + want);
		if (!/^(< 0\.01|\d+\.\d\d|\d+)$/.test(info['Data wait (ms/step)'] || '')) throw new Error('data wait shown as ' + info['Data wait (ms/step)']);
		if ((await rp.evaluate(() => trainerdDashboard.fmtMs(8.6e-5))) !== '< 0.01') throw new Error('fmtMs(8.6e-5) is not "< 0.01"');
		/* 24 loss points (4 steps an epoch): drawn raw, its line ends at its last value. */
		const labels = await rp.$eval('[data-chart="0"]', (el) => el.uplot.series.map((x) => x.label));
		if (labels.includes('loss (raw)') || !labels.includes('loss')) throw new Error('a 24-point loss is smoothed: ' + labels.join(', '));
		await rp.goto(d.url + '/');
		await rp.waitForSelector(`tr[data-job="${rid}"]`, { timeout: 15000 });
		const heads = await rp.$$eval('thead th', (els) => els.map((e) => e.textContent));
		if (!heads.includes('Epoch loss')) throw new Error('jobs table heads: ' + heads.join(', '));
		const cell = await rp.textContent(`tr[data-job="${rid}"] td[data-label="Epoch loss"]`);
		if (cell !== want) throw new Error('jobs table shows loss ' + cell + ', the summary\'s epoch loss is ' + want);
		await rp.close();
	});

	check('no script errors on the pages', pageErrors.length === 0, pageErrors.join('; '));
	check('nothing the page asked for was missing', missing.length === 0, missing.join(' '));
	await context.close();

	// ---- priority preemption: the form's box, the badge naming who ----
	const pd = await startDaemon(2, ['--preemption-min-run', '0']);
	const pctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
	const ppage = await pctx.newPage();
	const perrors = [];
	ppage.on('pageerror', (e) => perrors.push(e.message));
	await step('preemption: a preemptible job shows who preempted it, and why', async () => {
		await ppage.goto(pd.url + '/');
		await ppage.click('#submit summary');
		await ppage.fill('#spec-text', JSON.stringify({ ...longJob, name: 'browser-low' }, null, 2));
		await ppage.check('#spec-preemptible');
		await ppage.click('#submit-btn');
		await ppage.waitForURL(/#\/jobs\/\d+$/, { timeout: 10000 });
		const low = Number(/(\d+)$/.exec(ppage.url())[1]);
		const lowJob = await (await fetch(pd.url + '/jobs/' + low)).json();
		if (lowJob.preemptible !== true) throw new Error('the form did not submit it preemptible');
		await waitFor('the low job runs', async () => (await jobState(pd, low)) === 'running', 20000);
		const r = await fetch(pd.url + '/jobs?priority=5', { method: 'POST', headers: { 'Content-Type': 'application/json' },
			body: JSON.stringify({ ...longJob, name: 'browser-high' }) }); /* runs until cancelled below */
		const high = (await r.json()).id;
		await ppage.goto(pd.url + '/');
		const badge = await ppage.waitForSelector(`tr[data-job="${low}"] .badge.preempted[data-preempted-by="${high}"]`, { timeout: 20000 });
		const title = await badge.getAttribute('title');
		if (!title.includes('preempted by job ' + high)) throw new Error('badge title: ' + title);
		await ppage.screenshot({ path: path.join(artifacts, 'preempted.png'), fullPage: true });
		for (const id of [low, high]) await fetch(pd.url + '/jobs/' + id + '/cancel', { method: 'POST' });
	});
	check('preemption: no script errors', perrors.length === 0, perrors.join('; '));
	await pctx.close();

	// ---- daemon with a token ----
	const t = await startDaemon(2, ['--token', TOKEN]);
	const tid = await submit(t, shortJob, TOKEN);
	const tctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
	const tpage = await tctx.newPage();
	const turls = [];
	tpage.on('request', (r) => turls.push(r.url()));
	const terrors = [];
	tpage.on('pageerror', (e) => terrors.push(e.message));

	await step('with a token: the page asks for it, once, and then works', async () => {
		await tpage.goto(t.url + '/');
		await tpage.waitForSelector('#token-dialog[open]', { timeout: 10000 });
		await tpage.screenshot({ path: path.join(artifacts, 'token.png') });
		await tpage.fill('#token-input', TOKEN);
		await tpage.press('#token-input', 'Enter');
		await tpage.waitForSelector(`tr[data-job="${tid}"]`, { timeout: 10000 });
		await tpage.goto(t.url + '/#/jobs/' + tid);
		await tpage.reload();
		await tpage.waitForSelector('[data-chart="0"] canvas', { timeout: 20000 });
		await waitFor('points', async () => (await chartPoints(tpage)) > 0, 20000);
		if (await tpage.$('#token-dialog[open]')) throw new Error('asked again after a reload');
		const stored = await tpage.evaluate(() => sessionStorage.getItem('trainerd.token'));
		if (stored !== TOKEN) throw new Error('session storage holds ' + stored);
		const leaked = turls.filter((u) => u.includes(TOKEN));
		if (leaked.length) throw new Error('token in a URL: ' + leaked[0]);
	});
	check('with a token: no script errors', terrors.length === 0, terrors.join('; '));
	await tctx.close();
} catch (e) {
	check('browser test setup', false, e && e.stack ? e.stack : String(e));
}
await finish();
