/* trainerd dashboard: the experiments pages (docs/design.md, "Dashboard";
 * the API in docs/experiments.md).  #/experiments lists them;
 * #/experiments/<id> shows one: its trials (sortable, each linked to its
 * job's page), every trial's metric curve on one chart with the best
 * trial's drawn bold, the metric against each parameter, and pause,
 * resume and cancel for a token whose role may use them.  Built with the
 * DOM only, like app.js, whose helpers it uses (window.trainerdUi). */
'use strict';
(function () {
	const ui = window.trainerdUi;
	const { h, api, poller, stateBadge, fmtNum, age, toast } = ui;
	const SVG = 'http://www.w3.org/2000/svg';
	/* Points per trial curve: dozens of trials share one chart. */
	const CURVE_POINTS = 500;
	const POLL_MS = 2000;
	/* An experiment's ends; any other state can still change. */
	const ENDED = ['completed', 'failed', 'cancelled'];
	const ended = (x) => (x.terminal !== undefined ? x.terminal : ENDED.includes(x.state));

	/* ---- pure pieces (the browser test checks them directly) ---- */
	/* A parameter's value as a table shows it. */
	function fmtParam(v) {
		/* Four significant digits: a learning rate of 0.001234 is not 0.0012. */
		if (typeof v === 'number') return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
		return v === undefined || v === null ? '–' : typeof v === 'string' ? v : JSON.stringify(v);
	}
	/* Sorts trials by a column: 'trial', 'state', 'rung', 'metric',
	 * 'steps', or 'param:<pointer>'.  Trials without a value (no metric
	 * yet) come last whichever the direction; ties keep trial order. */
	function sortTrials(trials, key, dir) {
		const get = (t) => (key.startsWith('param:') ? (t.parameters || {})[key.slice(6)] : t[key]);
		const none = (v) => v === undefined || v === null || (typeof v === 'number' && !isFinite(v));
		return trials.slice().sort((a, b) => {
			const x = get(a), y = get(b);
			if (none(x) || none(y)) return none(x) - none(y) || a.trial - b.trial;
			const c = typeof x === 'number' && typeof y === 'number' ? x - y : String(x).localeCompare(String(y));
			return (dir === 'desc' ? -c : c) || a.trial - b.trial;
		});
	}
	/* Where a parameter's values go on an axis: a choice or grid by
	 * category, in the order the spec lists them (as are values that are
	 * not all numbers); sampled numbers on a linear or (log_uniform, or
	 * positive values spanning 100x or more) log axis. */
	function paramAxis(spec, values) {
		const nums = values.filter((v) => typeof v === 'number' && isFinite(v));
		const listed = spec && Array.isArray(spec.choice || spec.grid);
		if (!listed && nums.length === values.length && nums.length) {
			let lo = Math.min(...nums), hi = Math.max(...nums);
			const log = (spec && spec.log_uniform !== undefined) || (lo > 0 && hi / lo >= 100);
			if (log && lo > 0) return { kind: 'log', lo, hi, pos: (v) => Math.log10(v) };
			return { kind: 'linear', lo, hi, pos: (v) => v };
		}
		const cats = [];
		for (const v of [...(listed ? spec.choice || spec.grid : []), ...values]) if (!cats.some((c) => JSON.stringify(c) === JSON.stringify(v))) cats.push(v);
		return { kind: 'category', cats, lo: 0, hi: cats.length - 1,
			pos: (v) => cats.findIndex((c) => JSON.stringify(c) === JSON.stringify(v)) };
	}
	/* About n round ticks between lo and hi. */
	function ticks(lo, hi, n) {
		if (!(hi > lo)) return [lo];
		const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
		const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
		const out = [];
		for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9 && out.length < 50; v += step) out.push(Number(v.toPrecision(12)));
		return out;
	}
	/* The best trial's number: the experiment's own `best`, else the
	 * trial with the best metric for the goal. */
	function bestTrial(x) {
		if (x.best && x.best.trial !== undefined && x.best.trial !== null) return x.best.trial;
		const goal = (x.search && x.search.goal) || 'min';
		const done = (x.trials || []).filter((t) => typeof t.metric === 'number' && isFinite(t.metric));
		if (!done.length) return null;
		return sortTrials(done, 'metric', goal === 'max' ? 'desc' : 'asc')[0].trial;
	}

	/* ---- list page ---- */
	async function fetchExperiments() {
		const out = [];
		let after = null;
		for (let page = 0; page < 10; page++) {
			const q = new URLSearchParams({ limit: '1000' });
			if (after) q.set('after', after);
			const r = await api('/experiments?' + q);
			out.push(...(r.experiments || []));
			if (!r.next) break;
			after = r.next;
		}
		return out.sort((a, b) => b.id - a.id);
	}
	function listPage(main) {
		const ctl = new AbortController();
		const tbody = h('tbody');
		const empty = h('p', { class: 'muted', text: 'Loading experiments…' });
		main.append(h('div', { class: 'card' },
			h('h1', { text: 'Experiments' }),
			h('div', { class: 'table-wrap' }, h('table', { id: 'experiments-table', class: 'stack' },
				h('thead', {}, h('tr', {}, ['Experiment', 'State', 'Search', 'Trials', 'Best', 'Age']
					.map((t, i) => h('th', { class: i === 3 || i >= 4 ? 'num' : '', text: t })))), tbody)),
			empty));
		poller(ctl.signal, POLL_MS, async () => {
			const list = await fetchExperiments();
			tbody.replaceChildren(...list.map(listRow));
			empty.textContent = list.length ? ''
				: 'No experiments yet: submit one with POST /experiments or trainctl experiment submit (docs/experiments.md).';
		});
		return () => ctl.abort();
	}
	function listRow(x) {
		const s = x.search || {}, trials = x.trials || [];
		const done = trials.filter((t) => ENDED.includes(t.state)).length;
		const best = x.best && typeof x.best.metric === 'number' ? (s.metric || 'metric') + ' ' + fmtNum(x.best.metric) : '–';
		return h('tr', { class: 'job-row', 'data-experiment': x.id },
			h('td', { class: 'name' }, h('a', { href: '#/experiments/' + x.id, text: '#' + x.id + ' ' + (x.name || '') })),
			h('td', { 'data-label': 'State' }, stateBadge(x.state)),
			h('td', { 'data-label': 'Search', text: (s.method || '–') + (s.metric ? ', ' + (s.goal || 'min') + ' ' + s.metric : '') }),
			h('td', { class: 'num', 'data-label': 'Trials', text: done + ' done of ' + (s.max_trials || trials.length) }),
			h('td', { class: 'num', 'data-label': 'Best', text: best }),
			h('td', { class: 'num', 'data-label': 'Age', text: age(x.submitted_at), title: x.submitted_at || '' }));
	}

	/* ---- experiment page ---- */
	function experimentPage(main, idText) {
		const id = Number(idText);
		const ctl = new AbortController(), signal = ctl.signal;
		/* curves: job id -> {steps, values, readAt (the trial's steps when
		 * read), state}; sort: the trials table's column and direction. */
		const st = { x: null, curves: new Map(), sort: null, role: null, chart: null, chartKey: '' };
		const title = h('h1', { id: 'experiment-title', text: 'Experiment #' + id });
		const badge = h('span', { id: 'experiment-state' });
		const feedback = h('span', { id: 'experiment-feedback', class: 'muted small', role: 'status', 'aria-live': 'polite' });
		const actions = h('div', { class: 'row', id: 'experiment-actions' });
		const info = h('dl', { class: 'info', id: 'experiment-info' });
		const rungsBox = h('div', { id: 'experiment-rungs' });
		const trialsHead = h('tr');
		const trialsBody = h('tbody');
		const chartEl = h('div', { class: 'chart', id: 'trial-curves' });
		const chartNote = h('p', { class: 'muted small', id: 'trial-curves-note' });
		const paramsBox = h('div', { id: 'param-charts', class: 'param-grid' });
		/* Pause, resume, cancel: which states allow each. */
		const CONTROLS = [
			['pause', 'Pause', 'pauses every running trial (each takes a checkpoint) and starts no new one', ['queued', 'running']],
			['resume', 'Resume', 'continues its trials from their checkpoints and goes on with the search', ['paused']],
			['cancel', 'Cancel', 'cancels every trial that has not ended and ends the search', ['queued', 'running', 'paused']],
		];
		const buttons = {};
		for (const [op, label, what, states] of CONTROLS) {
			const b = h('button', { type: 'button', id: 'exp-btn-' + op, class: op === 'cancel' ? 'danger' : '', text: label, disabled: true, hidden: true });
			b.dataset.states = states.join(' ');
			b.addEventListener('click', () => control(op, label, what, b));
			buttons[op] = b;
			actions.append(b);
		}
		main.append(
			h('div', { class: 'job-head' }, h('a', { href: '#/experiments', text: '← Experiments' }), title, badge,
				h('span', { class: 'spacer' }), feedback, actions),
			h('div', { class: 'job-grid' },
				h('div', {},
					h('div', { class: 'card' }, h('h2', { text: 'Trials' }),
						h('div', { class: 'table-wrap' }, h('table', { id: 'trials-table', class: 'stack' }, h('thead', {}, trialsHead), trialsBody))),
					h('div', { class: 'card chart-card' }, h('h2', { id: 'trial-curves-title', text: 'Metric of every trial' }), chartEl, chartNote),
					h('div', { class: 'card' }, h('h2', { id: 'param-charts-title', text: 'Metric against each parameter' }), paramsBox)),
				h('aside', {},
					h('div', { class: 'card info-card' }, h('h2', { text: 'Search' }), info),
					h('div', { class: 'card' }, h('h2', { text: 'Rungs' }), rungsBox))));

		/* ---- controls ---- */
		async function control(op, label, what, b) {
			if (!(await ui.confirmDialog('Experiment #' + id + ' ' + what + '.', label + ' experiment #' + id))) return;
			b.dataset.busy = '1';
			b.disabled = true;
			feedback.textContent = op + ' requested…';
			try {
				const x = await api('/experiments/' + id + '/' + op, { method: 'POST', signal });
				if (x && x.id === id) render(x);
				feedback.textContent = op + ' accepted' + (x && x.state ? ': ' + x.state : '');
				toast(label + ': experiment #' + id + (x && x.state ? ' is ' + x.state : ''));
			} catch (e) {
				feedback.textContent = '';
				toast(label + ' refused: ' + e.message, true);
			} finally {
				delete b.dataset.busy;
				if (st.x) renderControls(st.x);
			}
		}
		function renderControls(x) {
			/* Offered only to a role that may use them (write and up),
			 * so a read-only token sees no buttons that would answer 403. */
			const may = st.role !== null && ui.roleAtLeast(st.role, 'write');
			for (const b of Object.values(buttons)) {
				b.hidden = !may;
				if (!b.dataset.busy) b.disabled = !b.dataset.states.split(' ').includes(x.state);
			}
		}

		/* ---- the experiment ---- */
		function render(x) {
			st.x = x;
			const s = x.search || {};
			title.textContent = '#' + x.id + ' ' + (x.name || '');
			document.title = 'Experiment #' + x.id + ' ' + (x.name || '') + ' – trainerd';
			badge.replaceChildren(stateBadge(x.state));
			renderControls(x);
			const best = bestTrial(x);
			const bestRow = (x.trials || []).find((t) => t.trial === best);
			const rows = [
				['Method', s.method],
				['Metric', s.metric ? (s.goal || 'min') + ' ' + s.metric : null],
				['Trials', (x.trials || []).length + (s.max_trials ? ' of ' + s.max_trials : '')],
				['At once', s.max_concurrent],
				['Seed', s.seed],
			];
			if (s.max_length) rows.push(['Max length', fmtLength(s.max_length)]);
			if (s.min_length !== undefined) rows.push(['Min length', s.min_length]);
			if (s.method === 'asha' && s.reduction_factor !== undefined) rows.push(['Reduction factor', s.reduction_factor]);
			info.replaceChildren(...rows.filter((r) => r[1] !== undefined && r[1] !== null && r[1] !== '').flatMap(([k, v]) =>
				[h('dt', { text: k }), h('dd', { text: String(v) })]));
			if (bestRow || x.best) {
				const b = x.best || {};
				const job = b.job !== undefined ? b.job : bestRow && bestRow.job;
				info.append(h('dt', { text: 'Best trial' }), h('dd', { id: 'experiment-best' },
					h('a', { href: '#/jobs/' + job, text: 'trial ' + (b.trial !== undefined ? b.trial : best) + ' (job #' + job + ')' }),
					' ' + fmtNum(typeof b.metric === 'number' ? b.metric : bestRow && bestRow.metric)));
				if (b.checkpoint) info.append(h('dt', { text: 'Best checkpoint' }), h('dd', { id: 'experiment-checkpoint' }, checkpointLink(b.checkpoint)));
			}
			if (typeof x.steps === 'number') info.append(h('dt', { text: 'Steps (all trials)' }), h('dd', { id: 'experiment-steps', text: String(x.steps) }));
			if (x.error) info.append(h('dt', { text: 'Error' }), h('dd', { text: (x.error.code || 'error') + ': ' + (x.error.message || '') }));
			renderRungs(x.rungs);
			renderTrials(x, best);
			drawCurves(x, best);
			drawParams(x, best);
		}
		/* {"epochs": 9} -> "9 epochs". */
		function fmtLength(v) {
			return typeof v === 'object' ? Object.entries(v).map(([k, n]) => n + ' ' + k).join(', ') : String(v);
		}
		/* The best checkpoint's weights (`url`), as a download. */
		function checkpointLink(c) {
			return h('a', { href: c.url, download: 'job' + c.job + '-step' + c.step + '-model.safetensors',
				text: 'job #' + c.job + ', step ' + c.step });
		}
		/* ASHA's rungs: each one's length, the trials that reported there
		 * (best first, as the daemon ranks them) and those promoted. */
		function renderRungs(rungs) {
			if (!Array.isArray(rungs) || !rungs.length) { rungsBox.replaceChildren(h('p', { class: 'muted', text: 'none yet' })); return; }
			const unit = Object.keys(((st.x || {}).search || {}).max_length || {})[0] || '';
			rungsBox.replaceChildren(h('div', { class: 'table-wrap' }, h('table', { id: 'rungs-table' },
				h('thead', {}, h('tr', {}, ['Rung', 'Length', 'Reported', 'Promoted'].map((t, i) => h('th', { class: i < 2 ? 'num' : '', text: t })))),
				h('tbody', {}, rungs.map((r) => h('tr', { 'data-rung': r.rung },
					h('td', { class: 'num', text: r.rung }),
					h('td', { class: 'num', text: r.length + (unit ? ' ' + unit : '') }),
					h('td', { class: 'wrap', text: (r.results || []).map((q) => q.trial).join(', ') || '–',
						title: (r.results || []).map((q) => 'trial ' + q.trial + ': ' + fmtNum(q.metric)).join('\n') }),
					h('td', { class: 'wrap', text: (r.promoted || []).join(', ') || '–' })))))));
		}

		/* ---- trials table ---- */
		function columns(x) {
			const s = x.search || {};
			const names = Object.keys(x.parameters || {});
			for (const t of x.trials || []) for (const p of Object.keys(t.parameters || {})) if (!names.includes(p)) names.push(p);
			return [['trial', 'Trial', 'num'], ['job', 'Job', ''],
				...names.map((p) => ['param:' + p, p, 'num']),
				['state', 'State', ''], ['rung', 'Rung', 'num'], ['metric', s.metric || 'Metric', 'num'], ['steps', 'Steps', 'num']];
		}
		function renderTrials(x, best) {
			const cols = columns(x);
			if (!st.sort) st.sort = { key: 'metric', dir: (x.search || {}).goal === 'max' ? 'desc' : 'asc' };
			trialsHead.replaceChildren(...cols.map(([key, label, cls]) => {
				if (key === 'job') return h('th', { text: label });
				const on = st.sort.key === key;
				return h('th', { class: cls, 'aria-sort': on ? (st.sort.dir === 'asc' ? 'ascending' : 'descending') : 'none' },
					h('button', { type: 'button', class: 'sort', 'data-sort': key, text: label + (on ? (st.sort.dir === 'asc' ? ' ▲' : ' ▼') : ''),
						onclick: () => {
							st.sort = { key, dir: on && st.sort.dir === 'asc' ? 'desc' : 'asc' };
							renderTrials(st.x, bestTrial(st.x));
						} }));
			}));
			const trials = sortTrials(x.trials || [], st.sort.key, st.sort.dir);
			trialsBody.replaceChildren(...trials.map((t) => h('tr', { class: 'job-row' + (t.trial === best ? ' best' : ''), 'data-trial': t.trial },
				...cols.map(([key, label, cls]) => {
					if (key === 'trial') return h('td', { class: 'num name', 'data-label': 'Trial' },
						h('span', { class: 'sw', style: 'background:' + colour(t, best) }), String(t.trial), t.trial === best ? h('span', { class: 'best-mark', title: 'best trial', text: ' ★' }) : null);
					if (key === 'job') return h('td', { 'data-label': 'Job' }, t.job ? h('a', { href: '#/jobs/' + t.job, text: '#' + t.job }) : '–');
					if (key === 'state') return h('td', { 'data-label': 'State' }, t.state ? stateBadge(t.state) : '–');
					if (key.startsWith('param:')) return h('td', { class: cls, 'data-label': label, text: fmtParam((t.parameters || {})[key.slice(6)]) });
					return h('td', { class: cls, 'data-label': label, text: key === 'metric' ? fmtNum(t.metric) : fmtParam(t[key]) });
				}))));
		}
		/* A trial's colour on both charts and in the table: the best one
		 * in the text's colour (black, or white on a dark theme), the
		 * others from the palette. */
		function colour(t, best) {
			return t.trial === best ? getComputedStyle(document.body).color : ui.PALETTE[t.trial % ui.PALETTE.length];
		}

		/* ---- curves ---- */
		/* Reads a trial's metric again when its step count has moved since
		 * the last read, or its state has (its last points come with its
		 * end); a trial without a job yet has no curve. */
		async function readCurves(x) {
			const metric = (x.search || {}).metric;
			if (!metric) return false;
			let changed = false;
			for (const t of x.trials || []) {
				if (!t.job || signal.aborted) continue;
				const have = st.curves.get(t.job);
				if (have && have.steps_seen === t.steps && have.state === t.state) continue;
				const q = new URLSearchParams({ names: metric, max_points: String(CURVE_POINTS) });
				const r = await api('/jobs/' + t.job + '/metrics?' + q, { signal });
				const s = (r.series || {})[metric] || { steps: [], values: [] };
				st.curves.set(t.job, { steps: s.steps, values: s.values, steps_seen: t.steps, state: t.state });
				changed = true;
			}
			return changed;
		}
		function drawCurves(x, best) {
			const metric = (x.search || {}).metric || 'metric';
			const lines = (x.trials || []).map((t) => ({ t, c: st.curves.get(t.job) })).filter((l) => l.c && l.c.steps.length);
			/* The best trial last, so it is drawn over the others. */
			lines.sort((a, b) => (a.t.trial === best) - (b.t.trial === best) || a.t.trial - b.t.trial);
			chartEl.dataset.trials = JSON.stringify(lines.map((l) => l.t.trial));
			chartEl.dataset.best = best === null ? '' : String(best);
			chartNote.textContent = lines.length ? metric + ' by step; the best trial (' + (best === null ? 'none yet' : best) + ') is the bold line.'
				: 'No trial has reported ' + metric + ' yet.';
			if (!lines.length) { if (st.chart) { st.chart.destroy(); st.chart = null; } return; }
			const data = lines.length === 1 ? [lines[0].c.steps, lines[0].c.values] : ui.joinTables(lines.map((l) => [l.c.steps, l.c.values]));
			const series = [{ label: 'step' }, ...lines.map((l) => ({
				label: 'trial ' + l.t.trial, stroke: colour(l.t, best), width: l.t.trial === best ? 3 : 1.2, spanGaps: true,
				points: { show: l.c.steps.length === 1, size: 7, fill: colour(l.t, best) } }))];
			const key = series.map((s) => s.label + s.width).join('|');
			if (st.chart && key === st.chartKey) { st.chart.setData(data); return; }
			if (st.chart) st.chart.destroy();
			st.chartKey = key;
			const width = Math.max(280, chartEl.clientWidth || 600);
			const fg = getComputedStyle(document.body).color;
			st.chart = new uPlot({
				width, height: width < 500 ? 220 : 300,
				scales: { x: { time: false } }, series, legend: { show: false },
				axes: [{ label: 'step', stroke: fg, grid: { stroke: '#8882' } }, { label: metric, stroke: fg, grid: { stroke: '#8882' }, size: 60 }],
			}, data, chartEl);
			chartEl.uplot = st.chart; /* for the browser test: what is drawn */
		}

		/* ---- metric against each parameter ---- */
		function drawParams(x, best) {
			const metric = (x.search || {}).metric || 'metric';
			const names = columns(x).filter((c) => c[0].startsWith('param:')).map((c) => c[0].slice(6));
			const trials = (x.trials || []).filter((t) => typeof t.metric === 'number' && isFinite(t.metric));
			if (!names.length || !trials.length) {
				paramsBox.replaceChildren(h('p', { class: 'muted', text: trials.length ? 'No parameters.' : 'No trial has a ' + metric + ' yet.' }));
				return;
			}
			paramsBox.replaceChildren(...names.map((p) => scatter(p, (x.parameters || {})[p], trials, metric, best)));
		}
		/* One parameter's chart: a point per trial with a metric, linked to
		 * its job's page, the best one larger and outlined.  SVG, built with
		 * the DOM: a few dozen points need no chart library. */
		function scatter(name, spec, trials, metric, best) {
			const W = 360, H = 220, L = 58, R = 22, T = 10, B = 38;
			const pts = trials.filter((t) => (t.parameters || {})[name] !== undefined);
			const ax = paramAxis(spec, pts.map((t) => t.parameters[name]));
			const ys = pts.map((t) => t.metric);
			let y0 = Math.min(...ys), y1 = Math.max(...ys);
			if (!(y1 > y0)) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
			const pad = (y1 - y0) * 0.08;
			y0 -= pad; y1 += pad;
			const p0 = ax.kind === 'category' ? -0.5 : ax.pos(ax.lo), p1 = ax.kind === 'category' ? ax.cats.length - 0.5 : ax.pos(ax.hi);
			const xpad = ax.kind === 'category' ? 0 : (p1 - p0 || 1) * 0.06;
			const px = (v) => L + ((ax.pos(v) - (p0 - xpad)) / ((p1 + xpad) - (p0 - xpad) || 1)) * (W - L - R);
			const pxPos = (p) => L + ((p - (p0 - xpad)) / ((p1 + xpad) - (p0 - xpad) || 1)) * (W - L - R);
			const py = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
			const el = (tag, attrs, ...kids) => {
				const n = document.createElementNS(SVG, tag);
				for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
				for (const k of kids) n.append(k);
				return n;
			};
			const text = (x, y, s, anchor, cls) => { const t = el('text', { x, y, 'text-anchor': anchor, class: cls || 'tick' }); t.textContent = s; return t; };
			const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, class: 'scatter', role: 'img', 'data-param': name,
				'aria-label': metric + ' against ' + name + ', one point per trial' });
			svg.append(el('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }), el('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' }));
			for (const v of ticks(y0, y1, 4)) {
				svg.append(el('line', { x1: L, x2: W - R, y1: py(v), y2: py(v), class: 'grid' }), text(L - 5, py(v) + 4, fmtParam(v), 'end'));
			}
			if (ax.kind === 'category') ax.cats.forEach((c, i) => svg.append(text(pxPos(i), H - B + 15, fmtParam(c), 'middle')));
			else if (ax.kind === 'log') {
				for (let e = Math.floor(Math.log10(ax.lo)); e <= Math.ceil(Math.log10(ax.hi)) && e < 400; e++)
					if (e >= Math.log10(ax.lo) - 0.3 && e <= Math.log10(ax.hi) + 0.3) svg.append(text(pxPos(e), H - B + 15, '1e' + e, 'middle'));
			} else for (const v of ticks(ax.lo, ax.hi, 4)) svg.append(text(px(v), H - B + 15, fmtParam(v), 'middle'));
			svg.append(text((L + W - R) / 2, H - 4, name + (ax.kind === 'log' ? ' (log)' : ''), 'middle', 'label'));
			const yLabel = text(0, 0, metric, 'middle', 'label');
			yLabel.setAttribute('transform', `translate(11 ${(T + H - B) / 2}) rotate(-90)`);
			svg.append(yLabel);
			/* The best point last, on top. */
			pts.sort((a, b) => (a.trial === best) - (b.trial === best));
			for (const t of pts) {
				const isBest = t.trial === best;
				const dot = el('circle', { cx: px(t.parameters[name]).toFixed(1), cy: py(t.metric).toFixed(1), r: isBest ? 7 : 4.5,
					fill: colour(t, best), class: isBest ? 'pt best' : 'pt', 'data-trial': t.trial });
				const tip = el('title');
				tip.textContent = 'trial ' + t.trial + ': ' + name + ' = ' + fmtParam(t.parameters[name]) + ', ' + metric + ' = ' + fmtNum(t.metric);
				dot.append(tip);
				svg.append(t.job ? el('a', { href: '#/jobs/' + t.job }, dot) : dot);
			}
			return h('figure', { class: 'param-chart' }, svg);
		}

		/* ---- polling ---- */
		let curvesRead = Promise.resolve();
		poller(signal, POLL_MS, async () => {
			let x;
			try {
				x = await api('/experiments/' + id, { signal });
			} catch (e) {
				/* No such experiment: say so, and stop asking. */
				if (!(e instanceof ui.ApiError) || e.status !== 404) throw e;
				main.replaceChildren(h('div', { class: 'card error-box', role: 'alert' },
					h('strong', { text: 'Experiment #' + id + ': ' }), e.message, ' ', h('a', { href: '#/experiments', text: 'back to experiments' })));
				ctl.abort();
				return;
			}
			if (signal.aborted) return;
			render(x);
			/* One read of the curves at a time; the page goes on showing the
			 * experiment meanwhile. */
			curvesRead = curvesRead.then(async () => {
				if (await readCurves(x).catch(() => false)) drawCurves(st.x, bestTrial(st.x));
			});
		});
		ui.myRole().then((role) => { st.role = role; if (st.x) renderControls(st.x); }, () => {});
		let resizeTimer = null;
		const onResize = () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(() => { st.chartKey = ''; if (st.x) drawCurves(st.x, bestTrial(st.x)); }, 150); };
		window.addEventListener('resize', onResize);
		return () => {
			ctl.abort();
			window.removeEventListener('resize', onResize);
			if (st.chart) st.chart.destroy();
			document.title = 'trainerd';
		};
	}

	ui.addPage(/^#\/experiments$/, 'experiments', listPage);
	ui.addPage(/^#\/experiments\/(\d+)$/, 'experiments', experimentPage);
	window.trainerdExperiments = Object.freeze({ sortTrials, paramAxis, ticks, bestTrial, fmtParam });
})();
