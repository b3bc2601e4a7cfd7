// Browser test of the dashboard's experiment pages (#/experiments,
// #/experiments/<id>): Debian's chromium driven by playwright-core, as
// tests/browser/test_dashboard.mjs, against a real daemon on loopback.
// The pages are checked twice: against a stubbed experiment (fixed data
// answered by the browser: ties, a failed trial, a pending one, a choice
// parameter) and against a real ASHA sweep of the learning rate on
// synthetic data.
//
// Checks: the list shows the experiment; its page shows one row per trial
// with the parameters, state, rung, metric and steps the daemon gives,
// each linked to its job's page (which links back); the table sorts by
// metric and by parameter, both ways, trials without a metric last; the
// best trial (the daemon's) is marked and its curve is the bold one of a
// chart with a line per trial that reported, each ending at its job's
// last point; each parameter's chart has a point per trial with a metric,
// placed by value (log axis for log_uniform), the best marked and each
// linked to its job; a read-only token sees no controls (on a job's page
// neither), a write token pauses, resumes and cancels a whole experiment
// (after confirmation) and the page shows each state; an unknown
// experiment says so; a phone stacks the table.  Screenshots go to
// ARTIFACT_DIR.
//
// Usage: node tests/browser/test_experiments.mjs TRAINERD ARTIFACT_DIR
// Prints "RESULT: N passed, M failed".  Bounded: each wait has a timeout
// and the whole run is killed after 240 s.
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';
import { browserTest, waitFor } from './lib.mjs';

const run = browserTest('test_experiments', 240000);
const { artifacts, check, step } = run;
const READ_TOKEN = 'experiments-read-token', WRITE_TOKEN = 'experiments-write-token';
let daemon = null, browser = null;

/* Tokens of two roles, from a token file (mode 0600, as the daemon wants). */
async function startDaemon(devices) {
	const tokens = path.join(artifacts, 'tokens');
	fs.rmSync(tokens, { force: true });
	fs.writeFileSync(tokens, `read:${READ_TOKEN}\nwrite:${WRITE_TOKEN}\n`, { mode: 0o600 });
	daemon = await run.startDaemon(devices, ['--token-file', tokens]);
}
async function call(method, p, body) {
	const headers = { Authorization: 'Bearer ' + WRITE_TOKEN };
	if (body) headers['Content-Type'] = 'application/json';
	const r = await fetch(daemon.url + p, { method, headers, body: body ? JSON.stringify(body) : undefined });
	const text = await r.text();
	if (!r.ok) throw new Error(method + ' ' + p + ': HTTP ' + r.status + ' ' + text);
	return JSON.parse(text);
}

/* A small classifier: each trial takes well under a second a rung. */
const baseSpec = {
	seed: 5,
	model: { inputs: 8, layers: [{ type: 'dense', units: 16 }, { type: 'relu' }, { type: 'dense', units: 3 }],
		loss: 'softmax_cross_entropy' },
	data: { train: { format: 'synthetic', task: 'classification', samples: 512, features: 8, classes: 3, noise: 0.5 } },
	batch_size: 32, max_steps: 27, optimizer: { type: 'sgd', lr: 0.01 }, devices: 1,
};
/* Nine trials, rungs at 3, 9 and 27 steps: the bottom two thirds stop at
 * the first rung.  The training loss is every step's, so each rung has
 * one. */
const sweep = {
	name: 'browser-sweep', spec: baseSpec,
	search: { method: 'asha', metric: 'loss', goal: 'min', max_trials: 9, max_concurrent: 2, seed: 1,
		max_length: { steps: 27 }, reduction_factor: 3 },
	parameters: { '/optimizer/lr': { log_uniform: [0.001, 1.0] } },
};
/* Trials that run until stopped, for the controls: a data load cost
 * makes each step slow. */
const slow = {
	name: 'browser-controls',
	spec: { ...baseSpec, max_steps: 200000, data: { train: { ...baseSpec.data.train, load_cost_us: 2000 } } },
	search: { method: 'random', metric: 'loss', max_trials: 2, max_concurrent: 1, seed: 2 },
	parameters: { '/optimizer/lr': { uniform: [0.01, 0.1] } },
};

const PARAM = '/optimizer/lr';
/* The trials table as the page shows it, row by row. */
const tableRows = (page) => page.$$eval('#trials-table tbody tr', (trs) => trs.map((tr) => ({
	trial: Number(tr.dataset.trial), best: tr.classList.contains('best'),
	cells: [...tr.cells].map((td) => td.textContent.trim()),
	href: tr.querySelector('a[href^="#/jobs/"]')?.getAttribute('href') || null })));
const headers = (page) => page.$$eval('#trials-table thead th', (ths) => ths.map((th) => th.textContent.replace(/[▲▼]/g, '').trim()));
const close = (a, b) => Math.abs(a - b) <= Math.abs(b) * 1e-3 + 1e-4;

/* A stubbed experiment: the page's rendering, sorting and controls
 * checked against fixed data, whatever the daemon's searcher does.  Ten
 * trials at three rungs, a choice parameter beside the learning rate, one
 * trial pending (no job yet), one failed (no metric), two with equal
 * metrics (ties sort by trial). */
function stubExperiment() {
	const lrs = [0.003, 0.02, 0.5, 0.001, 0.1, 0.04, 0.007, 0.2, 0.012, 0.3];
	const trials = lrs.map((lr, i) => ({ trial: i, job: 900 + i, parameters: { [PARAM]: lr, '/model/layers/0/units': i % 2 ? 32 : 16 },
		state: i === 4 ? 'running' : i === 8 ? 'failed' : i % 3 ? 'stopped' : 'paused', rung: i === 4 ? 2 : i % 3 ? 0 : 1,
		metric: i === 8 ? null : Number((Math.abs(Math.log10(lr) + 1.3) + 0.1).toFixed(6)), rung_metrics: [], steps: i === 4 ? 20 : i % 3 ? 3 : 9 }));
	trials[9] = { trial: 9, job: null, parameters: { [PARAM]: 0.3, '/model/layers/0/units': 32 }, state: 'pending', rung: null, metric: null, rung_metrics: [], steps: 0 };
	trials[6].metric = trials[0].metric; /* a tie */
	return { id: 4242, name: 'stub-sweep', state: 'running', terminal: false, priority: 0, spec: {},
		search: { method: 'asha', metric: 'val_loss', goal: 'min', max_trials: 10, max_concurrent: 2, seed: 1, max_length: { steps: 27 }, min_length: 3, reduction_factor: 3 },
		parameters: { [PARAM]: { log_uniform: [0.001, 1] }, '/model/layers/0/units': { choice: [16, 32] } },
		trials, best: { trial: 4, job: 904, metric: trials[4].metric, checkpoint: { job: 904, step: 18, url: '/jobs/904/checkpoints/18/model.safetensors' } },
		rungs: [{ rung: 0, length: 3, results: [], promoted: [0, 3, 4, 6] }, { rung: 1, length: 9, results: [], promoted: [4] }, { rung: 2, length: 27, results: [], promoted: [] }],
		steps: 74, error: null, submitted_at: new Date(Date.now() - 300000).toISOString(), finished_at: null };
}
/* A stub trial's curve: falls to its metric at its last step. */
function stubCurve(t) {
	const steps = [], values = [];
	for (let k = 1; k <= t.steps; k++) { steps.push(k); values.push(k === t.steps ? (t.metric === null ? 3 : t.metric) : (t.metric || 2) + 1.5 / k); }
	return { steps, values };
}
/* Answers the page's experiment requests from x (and, for its trials,
 * their curves); the rest goes to the daemon.  Controls change x's state
 * as the daemon would, and are recorded in posts. */
async function stubRoutes(ctx, x, posts) {
	await ctx.route(/\/experiments(\/|\?|$)/, async (route) => {
		const u = new URL(route.request().url()), method = route.request().method();
		const json = (o, status) => route.fulfill({ status: status || 200, contentType: 'application/json', body: JSON.stringify(o) });
		if (u.pathname === '/experiments') return json({ experiments: [x], next: null });
		if (u.pathname === '/experiments/' + x.id && method === 'GET') return json(x);
		const m = /^\/experiments\/(\d+)\/(pause|resume|cancel)$/.exec(u.pathname);
		if (m && Number(m[1]) === x.id && method === 'POST') {
			posts.push({ op: m[2], auth: route.request().headers().authorization });
			x.state = { pause: 'paused', resume: 'running', cancel: 'cancelled' }[m[2]];
			x.terminal = x.state === 'cancelled';
			return json(x, 202);
		}
		return json({ error: { code: 'not_found', message: 'experiment ' + u.pathname.split('/')[2] + ' not found' } }, 404);
	});
	await ctx.route(/\/jobs\/9\d\d\/metrics/, (route) => {
		const job = Number(/\/jobs\/(\d+)\//.exec(route.request().url())[1]);
		const t = x.trials.find((q) => q.job === job);
		return route.fulfill({ contentType: 'application/json', body: JSON.stringify({ series: t ? { [x.search.metric]: stubCurve(t) } : {} }) });
	});
}

/* The checks of an experiment's page, for the stub and the real sweep:
 * x is the experiment as the daemon (or stub) gives it, lastPoint(job)
 * the last step and value of that job's metric series. */
async function checkPage(page, label, x, lastPoint) {
	const metric = x.search.metric, goal = x.search.goal;
	const better = (a, b) => (goal === 'max' ? b.metric - a.metric : a.metric - b.metric) || a.trial - b.trial;
	await step(label + ': experiments list shows it with its state and a link', async () => {
		await page.goto(daemon.url + '/#/experiments');
		await page.waitForSelector(`tr[data-experiment="${x.id}"] [data-state="${x.state}"]`, { timeout: 15000 });
		const link = await page.getAttribute(`tr[data-experiment="${x.id}"] a`, 'href');
		if (link !== '#/experiments/' + x.id) throw new Error('link ' + link);
		if (!(await page.textContent(`tr[data-experiment="${x.id}"]`)).includes(x.name)) throw new Error('no name in the row');
		if ((await page.getAttribute('[data-nav="experiments"]', 'aria-current')) !== 'page') throw new Error('the Experiments link is not marked current');
		await page.screenshot({ path: path.join(artifacts, label + '-list.png'), fullPage: true });
	});

	await step(label + ': a row per trial with its parameters, state, rung, metric and steps, linked to its job', async () => {
		await page.click(`tr[data-experiment="${x.id}"] a`);
		await page.waitForSelector('#trials-table tbody tr', { timeout: 15000 });
		const cols = await headers(page);
		const params = Object.keys(x.parameters);
		for (const want of ['Trial', 'Job', ...params, 'State', 'Rung', metric, 'Steps'])
			if (!cols.includes(want)) throw new Error('columns ' + JSON.stringify(cols));
		const rows = await tableRows(page);
		if (rows.length !== x.trials.length) throw new Error(rows.length + ' rows, ' + x.trials.length + ' trials');
		const at = (name) => cols.indexOf(name);
		for (const t of x.trials) {
			const r = rows.find((q) => q.trial === t.trial);
			if (!r) throw new Error('no row for trial ' + t.trial);
			if (r.href !== (t.job ? '#/jobs/' + t.job : null)) throw new Error('trial ' + t.trial + ' links to ' + r.href + ', its job is ' + t.job);
			for (const p of params) {
				const v = Number(r.cells[at(p)]), want = t.parameters[p];
				if (!close(v, want)) throw new Error('trial ' + t.trial + ' ' + p + ' ' + r.cells[at(p)] + ', the daemon\'s ' + want);
			}
			if (r.cells[at('State')] !== t.state) throw new Error('trial ' + t.trial + ' state ' + r.cells[at('State')] + ', the daemon\'s ' + t.state);
			if (r.cells[at('Rung')] !== (t.rung === null ? '–' : String(t.rung))) throw new Error('trial ' + t.trial + ' rung ' + r.cells[at('Rung')] + ', the daemon\'s ' + t.rung);
			const m = r.cells[at(metric)];
			if (t.metric === null ? m !== '–' : !close(Number(m), t.metric)) throw new Error('trial ' + t.trial + ' ' + metric + ' ' + m + ', the daemon\'s ' + t.metric);
			if (r.cells[at('Steps')] !== String(t.steps)) throw new Error('trial ' + t.trial + ' steps ' + r.cells[at('Steps')]);
		}
	});

	await step(label + ': the table sorts by metric and by parameter, both ways; trials without a metric last', async () => {
		const col = async (name) => {
			const cols = await headers(page);
			return (await tableRows(page)).map((r) => r.cells[cols.indexOf(name)]);
		};
		const have = x.trials.filter((t) => t.metric !== null), none = x.trials.filter((t) => t.metric === null).map((t) => t.trial);
		const best1st = [...have.slice().sort(better).map((t) => t.trial), ...none];
		let order = (await tableRows(page)).map((r) => r.trial);
		if (JSON.stringify(order) !== JSON.stringify(best1st)) throw new Error('default order ' + order + ', best first ' + best1st);
		await page.click('#trials-table button[data-sort="metric"]');
		order = (await tableRows(page)).map((r) => r.trial);
		/* Worst first; ties keep trial order both ways. */
		const worst1st = [...have.slice().sort((a, b) => (goal === 'max' ? a.metric - b.metric : b.metric - a.metric) || a.trial - b.trial)
			.map((t) => t.trial), ...none];
		if (JSON.stringify(order) !== JSON.stringify(worst1st)) throw new Error('other way ' + order + ', worst first ' + worst1st);
		const sort = await page.getAttribute('#trials-table th:has(button[data-sort="metric"])', 'aria-sort');
		if (sort !== (goal === 'max' ? 'ascending' : 'descending')) throw new Error('aria-sort ' + sort);
		await page.click(`#trials-table button[data-sort="param:${PARAM}"]`);
		const lrs = (await col(PARAM)).map(Number);
		if (!lrs.every((v, i) => i === 0 || v >= lrs[i - 1])) throw new Error('by lr ascending: ' + lrs);
		await page.click(`#trials-table button[data-sort="param:${PARAM}"]`);
		const lrDown = (await col(PARAM)).map(Number);
		if (!lrDown.every((v, i) => i === 0 || v <= lrDown[i - 1])) throw new Error('by lr descending: ' + lrDown);
		await page.click('#trials-table button[data-sort="metric"]');
		if (goal === 'max') await page.click('#trials-table button[data-sort="metric"]');
	});

	await step(label + ': the best trial is marked, and its curve is the bold one, ending at its job\'s last point', async () => {
		const rows = await tableRows(page);
		const marked = rows.filter((r) => r.best).map((r) => r.trial);
		if (JSON.stringify(marked) !== JSON.stringify([x.best.trial])) throw new Error('rows marked best: ' + marked + ', the daemon\'s best ' + x.best.trial);
		const bestText = await page.textContent('#experiment-best');
		if (!bestText.includes('trial ' + x.best.trial) || !bestText.includes('#' + x.best.job)) throw new Error('best shown: ' + bestText);
		if (x.best.checkpoint && (await page.getAttribute('#experiment-checkpoint a', 'href')) !== x.best.checkpoint.url)
			throw new Error('checkpoint link ' + (await page.getAttribute('#experiment-checkpoint a', 'href')));
		await page.waitForSelector('#trial-curves canvas', { timeout: 15000 });
		const reported = x.trials.filter((t) => t.job && t.steps > 0).map((t) => t.trial).sort((a, b) => a - b);
		await waitFor('a line per trial', async () => {
			const shown = JSON.parse((await page.getAttribute('#trial-curves', 'data-trials')) || '[]');
			return JSON.stringify(shown.slice().sort((a, b) => a - b)) === JSON.stringify(reported);
		}, 15000).catch(async () => {
			throw new Error('lines for ' + (await page.getAttribute('#trial-curves', 'data-trials')) + ', trials ' + reported);
		});
		const drawn = await page.$eval('#trial-curves', (el) => el.uplot.series.slice(1).map((s, k) => {
			const xs = el.uplot.data[0], ys = el.uplot.data[k + 1];
			let i = ys.length - 1;
			while (i >= 0 && (ys[i] === null || ys[i] === undefined)) i--;
			return { label: s.label, width: s.width, lastStep: xs[i], lastValue: ys[i] };
		}));
		const bold = drawn.filter((s) => s.width > 2).map((s) => s.label);
		if (JSON.stringify(bold) !== JSON.stringify(['trial ' + x.best.trial])) throw new Error('bold lines ' + bold);
		for (const t of x.trials.filter((q) => reported.includes(q.trial))) {
			const line = drawn.find((q) => q.label === 'trial ' + t.trial), want = await lastPoint(t.job);
			if (!line || line.lastStep !== want.step || line.lastValue !== want.value)
				throw new Error('trial ' + t.trial + '\'s line ends at ' + JSON.stringify(line) + ', its job at ' + JSON.stringify(want));
		}
	});

	await step(label + ': the metric against each parameter, a point per trial with a metric, the best marked and each linked', async () => {
		const withMetric = x.trials.filter((t) => typeof t.metric === 'number');
		for (const p of Object.keys(x.parameters)) {
			const pts = await page.$$eval(`svg.scatter[data-param="${p}"] circle`, (cs) => cs.map((c) => ({
				trial: Number(c.dataset.trial), best: c.classList.contains('best'), cx: Number(c.getAttribute('cx')), cy: Number(c.getAttribute('cy')),
				href: c.parentNode.getAttribute('href') })));
			if (pts.length !== withMetric.length) throw new Error(p + ': ' + pts.length + ' points, ' + withMetric.length + ' trials with a metric');
			for (const t of withMetric) {
				const q = pts.find((o) => o.trial === t.trial);
				if (!q || q.href !== '#/jobs/' + t.job || q.best !== (t.trial === x.best.trial)) throw new Error(p + ' trial ' + t.trial + ': ' + JSON.stringify(q));
			}
			/* Placed by value: a larger value further right, a larger
			 * metric higher up (a smaller y). */
			const cx = withMetric.slice().sort((a, b) => a.parameters[p] - b.parameters[p]).map((t) => pts.find((o) => o.trial === t.trial).cx);
			if (!cx.every((v, i) => i === 0 || v >= cx[i - 1])) throw new Error(p + ': x not by value: ' + cx);
			const cy = withMetric.slice().sort((a, b) => a.metric - b.metric).map((t) => pts.find((o) => o.trial === t.trial).cy);
			if (!cy.every((v, i) => i === 0 || v <= cy[i - 1])) throw new Error(p + ': y not by metric: ' + cy);
			const logAxis = (await page.textContent(`svg.scatter[data-param="${p}"]`)).includes('(log)');
			if (logAxis !== ('log_uniform' in x.parameters[p])) throw new Error(p + ': log axis ' + logAxis);
		}
		const rungRows = await page.$$eval('#rungs-table tbody tr', (trs) => trs.length);
		if (rungRows !== x.rungs.length) throw new Error(rungRows + ' rung rows, ' + x.rungs.length + ' rungs');
		await page.screenshot({ path: path.join(artifacts, label + '.png'), fullPage: true });
	});
}

/* Pause, resume and cancel from the page, after confirmation, each shown
 * as the state it leads to; none left to press after the cancel. */
async function checkControls(page, label, id, daemonState) {
	await step(label + ': a write token pauses, resumes and cancels the experiment', async () => {
		await page.goto(daemon.url + '/#/experiments/' + id);
		await page.waitForSelector('#exp-btn-pause:not([hidden]):not([disabled])', { timeout: 15000 });
		if (!(await page.isDisabled('#exp-btn-resume'))) throw new Error('resume enabled while running');
		for (const [op, want] of [['pause', 'paused'], ['resume', 'running'], ['cancel', 'cancelled']]) {
			await page.waitForSelector(`#exp-btn-${op}:not([disabled])`, { timeout: 30000 });
			await page.click('#exp-btn-' + op);
			await page.waitForSelector('#confirm-dialog[open]', { timeout: 5000 });
			await page.click('#confirm-ok');
			await page.waitForSelector(`#experiment-state [data-state="${want}"]`, { timeout: 30000 });
			const state = await daemonState();
			if (state !== want) throw new Error(op + ': the page shows ' + want + ', the daemon ' + state);
			if (op === 'pause') await page.screenshot({ path: path.join(artifacts, label + '-paused.png'), fullPage: true });
		}
		const enabled = await page.$$eval('#experiment-actions button', (bs) => bs.filter((b) => !b.disabled).map((b) => b.id));
		if (enabled.length) throw new Error('enabled after cancel: ' + enabled);
	});
}
async function tokenContext(tok, viewport) {
	const ctx = await browser.newContext({ viewport: viewport || { width: 1280, height: 1000 } });
	await ctx.addInitScript((t) => sessionStorage.setItem('trainerd.token', t), tok);
	return ctx;
}

try {
	browser = run.browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
		args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage'] });
	await startDaemon(2);
	const pageErrors = [];

	// ---- a stubbed experiment (the page against fixed data) ----
	{
		const x = stubExperiment(), posts = [];
		const ctx = await tokenContext(WRITE_TOKEN);
		await stubRoutes(ctx, x, posts);
		const page = await ctx.newPage();
		page.on('pageerror', (e) => pageErrors.push(e.message));
		await checkPage(page, 'stub', x, async (job) => {
			const c = stubCurve(x.trials.find((t) => t.job === job));
			return { step: c.steps.at(-1), value: c.values.at(-1) };
		});
		const rctx = await tokenContext(READ_TOKEN);
		await stubRoutes(rctx, x, posts);
		await step('stub: a read-only token sees no controls; its role comes from GET /whoami', async () => {
			const rp = await rctx.newPage();
			const whoami = rp.waitForResponse((r) => r.url().endsWith('/whoami'), { timeout: 15000 });
			await rp.goto(daemon.url + '/#/experiments/' + x.id);
			const role = await (await whoami).json();
			if (role.role !== 'read') throw new Error('whoami says ' + JSON.stringify(role));
			await rp.waitForSelector('#experiment-state [data-state="running"]', { timeout: 15000 });
			await new Promise((r) => setTimeout(r, 300));
			const shown = await rp.$$eval('#experiment-actions button', (bs) => bs.filter((b) => !b.hidden).map((b) => b.textContent));
			if (shown.length) throw new Error('buttons shown: ' + shown);
		});
		await step('a read-only token sees no job controls either; a write token does', async () => {
			const job = (await call('POST', '/jobs', { ...baseSpec, name: 'browser-roles' })).id;
			const rp = await rctx.newPage();
			const whoami = rp.waitForResponse((r) => r.url().endsWith('/whoami'), { timeout: 15000 });
			await rp.goto(daemon.url + '/#/jobs/' + job);
			await whoami;
			await rp.waitForSelector('#job-state [data-state]', { timeout: 15000 });
			await waitFor('the job controls hidden', async () =>
				(await rp.$$eval('#job-actions button, #job-actions input', (els) => els.filter((e) => !e.hidden).length)) === 0, 5000)
				.catch(async () => { throw new Error('shown: ' + (await rp.$$eval('#job-actions button', (bs) => bs.filter((b) => !b.hidden).map((b) => b.id)))); });
			await page.goto(daemon.url + '/#/jobs/' + job);
			await page.waitForSelector('#job-state [data-state]', { timeout: 15000 });
			await new Promise((r) => setTimeout(r, 500));
			const shown = await page.$$eval('#job-actions button', (bs) => bs.filter((b) => !b.hidden).map((b) => b.id));
			if (shown.length !== 4) throw new Error('write token sees ' + shown);
		});
		await checkControls(page, 'stub', x.id, async () => x.state);
		check('stub: each control was one POST with the write token', JSON.stringify(posts.map((q) => q.op)) === '["pause","resume","cancel"]' &&
			posts.every((q) => q.auth === 'Bearer ' + WRITE_TOKEN), JSON.stringify(posts));
		await step('stub: an unknown experiment says so', async () => {
			await page.goto(daemon.url + '/#/experiments/99999');
			await page.waitForSelector('.error-box', { timeout: 10000 });
			if (!(await page.textContent('.error-box')).includes('#99999')) throw new Error(await page.textContent('.error-box'));
		});
		await step('stub: a phone stacks the trials table, no cell past the screen\'s edge', async () => {
			const phone = await (await tokenContext(WRITE_TOKEN, { width: 390, height: 800 })).newPage();
			await stubRoutes(phone.context(), stubExperiment(), []);
			await phone.goto(daemon.url + '/#/experiments/' + x.id);
			await phone.waitForSelector('#trials-table tbody tr', { timeout: 15000 });
			const off = await phone.$$eval('#trials-table td', (tds) => tds.filter((td) => td.getBoundingClientRect().right > window.innerWidth + 1).length);
			if (off) throw new Error(off + ' cells past the screen\'s edge');
			await phone.screenshot({ path: path.join(artifacts, 'stub-phone.png'), fullPage: true });
		});
		await step('the page\'s sort and axis helpers', async () => {
			const got = await page.evaluate(() => {
				const E = trainerdExperiments;
				const trials = [{ trial: 0, metric: 2 }, { trial: 1, metric: null }, { trial: 2, metric: 1 }, { trial: 3, metric: 1 }];
				return {
					asc: E.sortTrials(trials, 'metric', 'asc').map((t) => t.trial),
					desc: E.sortTrials(trials, 'metric', 'desc').map((t) => t.trial),
					cat: E.paramAxis({ choice: ['b', 'a'] }, ['a', 'a']).cats,
					numCat: E.paramAxis({ grid: [32, 16] }, [16, 16]).cats,
					log: E.paramAxis({ uniform: [1, 1000] }, [1, 1000]).kind,
					lin: E.paramAxis({ uniform: [1, 2] }, [1, 2]).kind,
					ticks: E.ticks(0, 1, 4),
					best: E.bestTrial({ search: { goal: 'max' }, trials }),
					lr: E.fmtParam(0.00123456),
				};
			});
			const want = { asc: [2, 3, 0, 1], desc: [0, 2, 3, 1], cat: ['b', 'a'], numCat: [32, 16], log: 'log', lin: 'linear', ticks: [0, 0.5, 1], best: 0, lr: '0.001235' };
			if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(JSON.stringify(got));
		});
		await ctx.close();
		await rctx.close();
	}

	// ---- a real sweep on the daemon ----
	{
		const created = await call('POST', '/experiments', sweep);
		let x = created;
		/* Let the sweep finish: the page is then checked against fixed figures. */
		await waitFor('the sweep to end', async () => (x = await call('GET', '/experiments/' + created.id)).terminal, 150000);
		check('sweep: completed', x.state === 'completed', 'state ' + x.state + ' ' + JSON.stringify(x.error));
		check('sweep: ASHA stopped trials at different rungs', new Set(x.trials.map((t) => t.rung)).size >= 2, JSON.stringify(x.trials.map((t) => t.rung)));
		const ctx = await tokenContext(WRITE_TOKEN);
		const page = await ctx.newPage();
		page.on('pageerror', (e) => pageErrors.push(e.message));
		await checkPage(page, 'sweep', x, async (job) => {
			const s = (await call('GET', '/jobs/' + job + '/metrics?names=' + x.search.metric + '&max_points=2')).series[x.search.metric];
			return { step: s.steps.at(-1), value: s.values.at(-1) };
		});
		await step('sweep: the jobs list says which experiment each trial serves', async () => {
			await page.goto(daemon.url + '/#/');
			await page.waitForSelector(`tr[data-job="${x.best.job}"] a.trial-of`, { timeout: 15000 });
			const a = await page.$eval(`tr[data-job="${x.best.job}"] a.trial-of`, (el) => [el.getAttribute('href'), el.textContent]);
			if (a[0] !== '#/experiments/' + x.id || !a[1].includes('trial ' + x.best.trial)) throw new Error('row says ' + a);
			await page.goto(daemon.url + '/#/experiments/' + x.id);
			await page.waitForSelector('#trials-table tbody tr', { timeout: 15000 });
		});
		await step('sweep: a trial\'s job page links back to its experiment', async () => {
			await page.click(`#trials-table tr[data-trial="${x.best.trial}"] a[href^="#/jobs/"]`);
			await page.waitForURL(new RegExp('#/jobs/' + x.best.job + '$'), { timeout: 5000 });
			await page.waitForSelector('#job-experiment a', { timeout: 10000 });
			const back = await page.getAttribute('#job-experiment a', 'href'), said = await page.textContent('#job-experiment');
			if (back !== '#/experiments/' + x.id || !said.includes('trial ' + x.best.trial)) throw new Error('job page says ' + said + ' -> ' + back);
		});
		const sx = (await call('POST', '/experiments', slow)).id;
		await waitFor('a controls trial running', async () => (await call('GET', '/experiments/' + sx)).state === 'running', 30000);
		await checkControls(page, 'sweep', sx, async () => (await call('GET', '/experiments/' + sx)).state);
		await ctx.close();
	}
	check('no script errors', pageErrors.length === 0, pageErrors.join('; '));
} catch (e) {
	check('setup', false, e && e.message ? e.message : String(e));
}
await run.finish();
