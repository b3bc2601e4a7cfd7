/* trainerd dashboard (docs/design.md §10).  It uses only the daemon's public
 * API, from the same origin, and builds every element with the DOM (no
 * HTML from data), so a job name cannot inject markup.  Pages: #/ (jobs and
 * the submit form), #/jobs/<id> (charts, info, log, checkpoints, controls),
 * #/experiments and #/experiments/<id> (experiments.js, through addPage),
 * #/devices.  Charts are uPlot (chosen by bench/dashboard: fastest of the
 * maintained candidates at four series of 100,000 points). */
'use strict';
(function () {
	const TOKEN_KEY = 'trainerd.token';
	const MAX_POINTS = 2000; /* per series and request: about two per pixel */
	/* A poll's new steps come downsampled to this many points a series,
	 * and a series the page holds is halved (pairs of points merged into
	 * one bucket) once it passes twice MAX_POINTS: a fast job's page keeps
	 * a bounded curve however long it stays open (docs/design.md,
	 * "Dashboard"). */
	const INCR_POINTS = 200;
	/* Metrics polls: every second while they bring points, backing off to
	 * this while they do not (a slow job, or one between epochs). */
	const POLL_MS = 1000, POLL_MAX_MS = 4000;
	const OTHERS_MS = 10000; /* series on no chart: read this often (pollMetrics) */
	const LOG_LINES = 300;
	/* The daemon's job states (docs/design.md, "The job"), for the state
	 * filter only: whether a state is an end comes with each job
	 * (`terminal`) and each state event. */
	const STATES = ['queued', 'running', 'stopping', 'paused', 'stopped', 'completed', 'failed', 'cancelled', 'interrupted', 'preempted'];
	const PALETTE = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#db2777', '#65a30d'];
	const LEVELS = { 0: 'emerg', 1: 'alert', 2: 'crit', 3: 'error', 4: 'warn', 5: 'notice', 6: 'info', 7: 'debug' };

	/* ---- small helpers ---- */
	function h(tag, attrs, ...children) {
		const el = document.createElement(tag);
		for (const [k, v] of Object.entries(attrs || {})) {
			if (v === null || v === undefined || v === false) continue;
			if (k === 'class') el.className = v;
			else if (k === 'text') el.textContent = v;
			else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
			else if (k === 'style') el.style.cssText = v;
			else el.setAttribute(k, v === true ? '' : v);
		}
		for (const c of children.flat()) {
			if (c === null || c === undefined || c === false) continue;
			el.append(c instanceof Node ? c : String(c));
		}
		return el;
	}
	const $ = (sel, root) => (root || document).querySelector(sel);
	const sleep = (ms, signal) => new Promise((resolve) => {
		const t = setTimeout(resolve, ms);
		if (signal) signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
	});
	function fmtNum(v, digits) {
		if (v === null || v === undefined || !isFinite(v)) return '–';
		const a = Math.abs(v);
		if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
		return v.toFixed(digits === undefined ? (a >= 100 ? 1 : 4) : digits);
	}
	/* Milliseconds with two decimals: a wait of 8.6e-5 ms is "< 0.01",
	 * not an exponent beside a share in per cent. */
	function fmtMs(v) {
		if (v === null || v === undefined || !isFinite(v)) return '–';
		if (v > 0 && v < 0.005) return '< 0.01';
		return v.toFixed(v >= 100 ? 0 : 2);
	}
	function fmtDuration(s) {
		if (s === null || s === undefined || !isFinite(s)) return '–';
		s = Math.max(0, Math.round(s));
		if (s < 60) return s + 's';
		if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
		if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
		return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
	}
	function fmtBytes(b) {
		if (b === null || b === undefined) return '–';
		const u = ['B', 'KB', 'MB', 'GB', 'TB'];
		let i = 0;
		while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
		return (i ? b.toFixed(1) : b) + ' ' + u[i];
	}
	const age = (iso) => (iso ? fmtDuration((Date.now() - Date.parse(iso)) / 1000) : '–');
	let toastTimer = null;
	function toast(msg, bad) {
		const t = $('#toast');
		t.textContent = msg;
		t.className = 'show' + (bad ? ' bad' : '');
		clearTimeout(toastTimer);
		toastTimer = setTimeout(() => { t.className = ''; }, bad ? 6000 : 3000);
	}

	/* ---- the API, with the bearer token asked for once ---- */
	class ApiError extends Error {
		constructor(status, body) {
			const e = (body && body.error) || {};
			super(e.message || ('HTTP ' + status));
			this.status = status;
			this.code = e.code || 'http_' + status;
			this.pointer = e.pointer || null;
			/* A refused spec's every problem, {message, pointer}. */
			this.errors = body && Array.isArray(body.errors) && body.errors.length ? body.errors : null;
		}
	}
	let tokenAsk = null;
	/* One dialog however many requests were refused; they all retry once
	 * the user has answered. */
	function askToken(why) {
		if (tokenAsk) return tokenAsk;
		tokenAsk = new Promise((resolve) => {
			const dlg = $('#token-dialog'), input = $('#token-input');
			$('#token-why').textContent = why;
			input.value = '';
			const done = (ev) => {
				ev.preventDefault();
				if (!input.value.trim()) return;
				sessionStorage.setItem(TOKEN_KEY, input.value.trim());
				$('#token-form').removeEventListener('submit', done);
				dlg.close();
				tokenAsk = null;
				resolve();
			};
			$('#token-form').addEventListener('submit', done);
			/* Esc would leave the page without data: keep asking. */
			dlg.addEventListener('cancel', (ev) => ev.preventDefault(), { once: true });
			dlg.showModal();
			input.focus();
		});
		return tokenAsk;
	}
	/* fetch() with the token as Authorization: Bearer (never in a URL). */
	async function apiFetch(path, opts) {
		opts = opts || {};
		for (let attempt = 0; ; attempt++) {
			const headers = new Headers(opts.headers || {});
			const tok = sessionStorage.getItem(TOKEN_KEY);
			if (tok) headers.set('Authorization', 'Bearer ' + tok);
			const r = await fetch(path, Object.assign({}, opts, { headers }));
			const method = (opts.method || 'GET').toUpperCase();
			/* 401: no token sent.  403 on a read: the token is not valid at
			 * all (a write may be refused to a read-only token instead). */
			const rejected = r.status === 401 || (r.status === 403 && tok && method === 'GET');
			if (!rejected || attempt >= 3) return r;
			if (r.status === 403) sessionStorage.removeItem(TOKEN_KEY);
			await askToken(r.status === 401 ? 'This daemon needs a bearer token.'
				: 'That token was not accepted; enter another.');
		}
	}
	async function api(path, opts) {
		const r = await apiFetch(path, opts);
		const text = await r.text();
		let body = null;
		try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
		if (!r.ok) throw new ApiError(r.status, body);
		return body;
	}
	function setConn(text) { $('#conn').textContent = text || ''; }

	/* ---- router: each page returns a cleanup function ---- */
	let cleanup = null;
	/* Pages of other files (experiments.js): a hash pattern whose groups
	 * are the render function's arguments, and the nav link it marks. */
	const pages = [];
	function addPage(pattern, nav, render) { pages.push({ pattern, nav, render }); }
	function route() {
		if (cleanup) { try { cleanup(); } catch (e) { /* the old page is gone anyway */ } }
		cleanup = null;
		setConn('');
		const main = $('#main');
		main.replaceChildren();
		const hash = location.hash || '#/';
		let m, page = 'jobs', nav = 'jobs';
		const extra = pages.find((p) => p.pattern.test(hash));
		if (extra) { page = nav = extra.nav; cleanup = extra.render(main, ...extra.pattern.exec(hash).slice(1)); }
		else if ((m = /^#\/jobs\/(\d+)$/.exec(hash))) { page = 'job'; cleanup = jobPage(main, Number(m[1])); }
		else if (hash === '#/devices') { page = nav = 'devices'; cleanup = devicesPage(main); }
		else cleanup = jobsPage(main);
		for (const a of document.querySelectorAll('[data-nav]'))
			a.toggleAttribute('aria-current', a.dataset.nav === nav);
		for (const a of document.querySelectorAll('[data-nav]'))
			if (a.hasAttribute('aria-current')) a.setAttribute('aria-current', 'page');
	}
	/* A poll loop that stops with the page and rests while the tab is hidden. */
	function poller(signal, ms, fn) {
		(async () => {
			while (!signal.aborted) {
				if (!document.hidden) {
					try {
						await fn();
						if ($('#conn').textContent !== 'live') setConn('');
					} catch (e) {
						if (signal.aborted) return;
						setConn(e instanceof ApiError ? e.message : 'daemon unreachable');
					}
				}
				await sleep(typeof ms === 'function' ? ms() : ms, signal);
			}
		})();
	}
	/* Asks before a control acts; resolves true when confirmed. */
	async function confirmDialog(text, okLabel) {
		const dlg = $('#confirm-dialog');
		$('#confirm-text').textContent = text;
		$('#confirm-ok').textContent = okLabel;
		$('#confirm-title').textContent = okLabel + '?';
		dlg.returnValue = '';
		return new Promise((resolve) => {
			dlg.addEventListener('close', () => resolve(dlg.returnValue === 'ok'), { once: true });
			dlg.showModal();
			$('#confirm-cancel').focus();
		});
	}
	/* The role the token in use grants (GET /whoami), asked once per
	 * token: controls a role may not use are not offered.  A daemon
	 * without the route is taken to allow all (it still checks). */
	let roleAsk = null, roleToken = null;
	function myRole() {
		const tok = sessionStorage.getItem(TOKEN_KEY);
		if (!roleAsk || tok !== roleToken) {
			roleToken = tok;
			roleAsk = api('/whoami').then((r) => r.role, (e) => {
				roleAsk = null;
				if (e.status === 404) return 'admin';
				throw e;
			});
		}
		return roleAsk;
	}
	const ROLES = ['read', 'write', 'admin'];
	const roleAtLeast = (have, need) => ROLES.indexOf(have) >= ROLES.indexOf(need);
	function stateBadge(state, extra) {
		return h('span', { class: 'state ' + state, 'data-state': state, text: extra || state });
	}
	/* Priority preemption (docs/design.md, "Preemption"): a preempted
	 * job's badge names who preempted it, with the reason as its title;
	 * a preemptible one that runs or waits says it may be. */
	function preemptBadge(job) {
		const p = job.preemption;
		if (job.state === 'preempted' && p)
			return h('span', { class: 'badge preempted', 'data-preempted-by': p.by, title: p.message || '', text: p.by === 'slurm' ? 'by Slurm' : 'by #' + p.by });
		if (job.preemptible && !job.terminal)
			return h('span', { class: 'badge preemptible', title: 'a job of higher priority may preempt it', text: 'preemptible' });
		return null;
	}

	/* ---- JSON pointer → place in the spec text ---- */
	/* Parses text as JSON and records where each value is, by JSON pointer
	 * (RFC 6901), so a daemon error's pointer can be shown in the text the
	 * user wrote.  Returns a Map pointer → [start, end), or null when the
	 * text is not JSON (the daemon's message then gives line and column). */
	function pointerMap(text) {
		const map = new Map();
		let i = 0;
		const ws = () => { while (i < text.length && ' \t\r\n'.includes(text[i])) i++; };
		const esc = (k) => k.replace(/~/g, '~0').replace(/\//g, '~1');
		function str() {
			const start = i++;
			while (i < text.length && text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
			i++;
			return JSON.parse(text.slice(start, i));
		}
		function value(ptr) {
			ws();
			const start = i, c = text[i];
			if (c === '{') {
				i++; ws();
				if (text[i] === '}') i++;
				else for (;;) {
					ws();
					if (text[i] !== '"') throw new Error('key');
					const keyStart = i, key = str();
					ws();
					if (text[i++] !== ':') throw new Error(':');
					const sub = ptr + '/' + esc(key);
					value(sub);
					/* The key is what a user looks for: start there. */
					map.set(sub, [keyStart, map.get(sub)[1]]);
					ws();
					if (text[i] === ',') { i++; continue; }
					if (text[i++] !== '}') throw new Error('}');
					break;
				}
			} else if (c === '[') {
				i++; ws();
				if (text[i] === ']') i++;
				else for (let n = 0; ; n++) {
					value(ptr + '/' + n);
					ws();
					if (text[i] === ',') { i++; continue; }
					if (text[i++] !== ']') throw new Error(']');
					break;
				}
			} else if (c === '"') {
				str();
			} else {
				const m = /^(-?\d+(\.\d+)?([eE][+-]?\d+)?|true|false|null)/.exec(text.slice(i, i + 64));
				if (!m) throw new Error('value');
				i += m[0].length;
			}
			map.set(ptr, [start, i]);
		}
		try { value(''); return map; } catch (e) { return null; }
	}
	/* The place to show for pointer: the value itself, or the nearest
	 * enclosing one that exists (a missing key's object). */
	function locate(text, pointer, message) {
		const map = pointerMap(text);
		if (map && pointer !== null) {
			let p = pointer;
			while (!map.has(p) && p) p = p.slice(0, p.lastIndexOf('/'));
			if (map.has(p)) return { range: map.get(p), exact: p === pointer };
		}
		const lc = /line (\d+), column (\d+)/.exec(message || '');
		if (lc) {
			const lines = text.split('\n'), line = Math.min(Number(lc[1]), lines.length);
			let off = 0;
			for (let n = 1; n < line; n++) off += lines[n - 1].length + 1;
			const col = Math.max(0, Math.min(Number(lc[2]) - 1, lines[line - 1].length));
			return { range: [off + col, off + col + 1], exact: true };
		}
		return null;
	}
	function lineOf(text, off) { return text.slice(0, off).split('\n').length; }
	/* A few lines around the error, the offending text marked. */
	function excerpt(text, range) {
		const lines = text.split('\n');
		const first = lineOf(text, range[0]), last = lineOf(text, Math.max(range[0], range[1] - 1));
		const from = Math.max(1, first - 2), to = Math.min(lines.length, Math.min(last, first + 6) + 2);
		const box = h('div', { class: 'excerpt', 'data-testid': 'spec-excerpt' });
		let off = 0;
		for (let n = 1; n < from; n++) off += lines[n - 1].length + 1;
		for (let n = from; n <= to; n++) {
			const line = lines[n - 1], a = Math.max(0, range[0] - off), b = Math.min(line.length, range[1] - off);
			const row = h('div', { class: n >= first && n <= last ? 'hit' : '' }, h('span', { class: 'ln', text: n }));
			if (b > a && n >= first && n <= last) row.append(line.slice(0, a), h('mark', { text: line.slice(a, b) }), line.slice(b));
			else row.append(line);
			box.append(row);
			off += line.length + 1;
		}
		return box;
	}

	/* ---- Jobs page ---- */
	let listFields = 'id,name,state,terminal,priority,devices,progress,summary,submitted_at,started_at,finished_at,error,preemptible,preemption,experiment,trial';
	async function fetchJobs(state) {
		const jobs = [];
		let after = null;
		for (let page = 0; page < 10; page++) {
			const q = new URLSearchParams({ limit: '1000' });
			if (state) q.set('state', state);
			if (after) q.set('after', after);
			if (listFields) q.set('fields', listFields);
			let body;
			try {
				body = await api('/jobs?' + q);
			} catch (e) {
				/* An older daemon without fields=: ask for whole jobs. */
				if (listFields && e.status === 400 && /fields/.test(e.message)) { listFields = null; page--; continue; }
				throw e;
			}
			jobs.push(...body.jobs);
			if (!body.next) break;
			after = body.next;
		}
		return jobs.sort((a, b) => b.id - a.id);
	}
	function jobsPage(main) {
		const ctl = new AbortController();
		const filter = h('select', { id: 'state-filter', 'aria-label': 'Filter by state' },
			h('option', { value: '', text: 'all states' }), STATES.map((s) => h('option', { value: s, text: s })));
		filter.value = sessionStorage.getItem('trainerd.filter') || '';
		const tbody = h('tbody');
		const empty = h('p', { class: 'muted', text: 'Loading jobs…' });
		const table = h('table', { id: 'jobs-table', class: 'stack' },
			h('thead', {}, h('tr', {}, ['Job', 'State', 'Progress', 'ETA', 'Epoch loss', 'Samples/s', 'Devices', 'Priority', 'Age']
				.map((t, i) => h('th', { class: i >= 3 && i !== 6 ? 'num' : '', text: t })))), tbody);
		main.append(
			h('div', { class: 'card' },
				h('div', { class: 'row' }, h('h1', { text: 'Jobs' }), h('span', { class: 'spacer' }),
					h('label', { for: 'state-filter', text: 'State' }), filter),
				h('div', { class: 'table-wrap' }, table), empty),
			submitForm());
		async function refresh() {
			const jobs = await fetchJobs(filter.value);
			tbody.replaceChildren(...jobs.map(jobRow));
			empty.textContent = jobs.length ? '' : (filter.value ? 'No ' + filter.value + ' jobs.' : 'No jobs yet: submit one below.');
		}
		filter.addEventListener('change', () => { sessionStorage.setItem('trainerd.filter', filter.value); refresh().catch(() => {}); });
		poller(ctl.signal, 2000, refresh);
		return () => ctl.abort();
	}
	function jobRow(job) {
		const p = job.progress || {}, s = job.summary || {};
		const total = p.total_steps || 0, step = p.step || 0;
		const pct = total ? Math.min(100, (100 * step) / total) : 0;
		const link = h('a', { href: '#/jobs/' + job.id, text: '#' + job.id + ' ' + job.name });
		/* data-label: the column's name, shown beside each value where a
		 * phone stacks a row's cells (app.css, table.stack). */
		const tr = h('tr', { class: 'job-row', 'data-job': job.id },
			h('td', { class: 'name' }, link, job.experiment ? h('a', { class: 'trial-of muted small', href: '#/experiments/' + job.experiment,
				text: ' (trial ' + job.trial + ' of experiment #' + job.experiment + ')' }) : null),
			h('td', { 'data-label': 'State' }, stateBadge(job.state), preemptBadge(job)),
			h('td', { 'data-label': 'Progress' }, h('progress', { max: total || 1, value: total ? step : 0, 'aria-label': 'progress of job ' + job.id }),
				h('span', { class: 'pct', text: total ? step + '/' + total + ' (' + pct.toFixed(0) + '%)' : step ? String(step) : '' })),
			h('td', { class: 'num', 'data-label': 'ETA', text: job.terminal ? '–' : fmtDuration(p.eta_s) }),
			/* Whole-run figures (docs/design.md, "Summary figures"): the
			 * newest epoch's mean loss, not one batch's. */
			h('td', { class: 'num', 'data-label': 'Epoch loss', text: fmtNum(s.epoch_loss) }),
			h('td', { class: 'num', 'data-label': 'Samples/s', text: fmtNum(p.samples_per_sec !== undefined ? p.samples_per_sec : s.samples_per_sec, 0) }),
			h('td', { 'data-label': 'Devices', text: (job.devices || []).join(', ') || '–' }),
			h('td', { class: 'num', 'data-label': 'Priority', text: job.priority }),
			h('td', { class: 'num', 'data-label': 'Age', text: age(job.submitted_at), title: job.submitted_at || '' }));
		return tr;
	}
	function submitForm() {
		const text = h('textarea', { id: 'spec-text', spellcheck: 'false', 'aria-label': 'Job spec (JSON)',
			placeholder: '{"name": "...", "model": {...}, "data": {...}, ...}' });
		text.value = sessionStorage.getItem('trainerd.draft') || '';
		text.addEventListener('input', () => sessionStorage.setItem('trainerd.draft', text.value));
		const file = h('input', { type: 'file', id: 'spec-file', accept: '.json,application/json' });
		const prio = h('input', { type: 'number', id: 'spec-priority', min: -1000, max: 1000, value: 0, style: 'width:6rem' });
		const preemptible = h('input', { type: 'checkbox', id: 'spec-preemptible',
			title: 'a job of higher priority may preempt it: it checkpoints, waits as preempted and resumes on its own' });
		const out = h('div', { id: 'submit-result', 'aria-live': 'polite' });
		const btn = h('button', { type: 'submit', class: 'primary', id: 'submit-btn', text: 'Submit job' });
		file.addEventListener('change', async () => {
			if (!file.files.length) return;
			text.value = await file.files[0].text();
			sessionStorage.setItem('trainerd.draft', text.value);
		});
		const form = h('form', { id: 'submit-form' },
			h('p', { class: 'muted small', text: 'Paste a job spec or load a .json file; the daemon checks it and points at any error.' }),
			text,
			h('div', { class: 'row', style: 'margin-top:.5rem' },
				h('label', { for: 'spec-file', text: 'File' }), file,
				h('label', { for: 'spec-priority', text: 'Priority' }), prio,
				preemptible, h('label', { for: 'spec-preemptible', text: 'Preemptible' }),
				h('span', { class: 'spacer' }), btn),
			out);
		form.addEventListener('submit', async (ev) => {
			ev.preventDefault();
			out.replaceChildren();
			btn.disabled = true;
			btn.textContent = 'Submitting…';
			try {
				const job = await api('/jobs?priority=' + encodeURIComponent(prio.value || '0') + (preemptible.checked ? '&preemptible=true' : ''),
					{ method: 'POST', headers: { 'Content-Type': 'application/json' }, body: text.value });
				sessionStorage.removeItem('trainerd.draft');
				toast('Submitted job #' + job.id);
				location.hash = '#/jobs/' + job.id;
			} catch (e) {
				out.append(specError(text, e));
			} finally {
				btn.disabled = false;
				btn.textContent = 'Submit job';
			}
		});
		return h('details', { class: 'card', id: 'submit', open: text.value ? true : null },
			h('summary', { text: 'Submit a job' }), form);
	}
	/* Each problem the daemon found (`errors`, else the one `error`), at
	 * its pointer with its line and excerpt; the first is selected. */
	function specError(textarea, e) {
		const box = h('div', { class: 'error-box', role: 'alert', 'data-testid': 'spec-error' });
		if (!(e instanceof ApiError)) {
			box.append(h('strong', { text: e.code ? e.code + ': ' : 'error: ' }), e.message);
			return box;
		}
		const problems = e.errors || [{ message: e.message, pointer: e.pointer }];
		if (problems.length > 1)
			box.append(h('strong', { text: e.code + ': ' + problems.length + ' problems' }));
		const list = problems.map((pr) => {
			const item = h('div', { class: 'spec-problem', 'data-testid': 'spec-problem', 'data-pointer': pr.pointer || '' },
				problems.length > 1 ? null : h('strong', { text: e.code + ': ' }), pr.message);
			const where = locate(textarea.value, pr.pointer, pr.message);
			if (pr.pointer)
				item.append(h('div', { class: 'small' }, 'at ', h('code', { class: 'pointer', 'data-testid': 'spec-pointer', text: pr.pointer }),
					where ? ', line ' + lineOf(textarea.value, where.range[0]) + (where.exact ? '' : ' (the enclosing value; the key is missing)') : ''));
			if (where) item.append(excerpt(textarea.value, where.range));
			box.append(item);
			return where;
		});
		const where = list[0];
		if (where) {
			textarea.focus();
			textarea.setSelectionRange(where.range[0], where.range[1]);
			/* Bring the selection into view: setSelectionRange does not scroll. */
			const line = lineOf(textarea.value, where.range[0]);
			textarea.scrollTop = Math.max(0, (line - 3) * parseFloat(getComputedStyle(textarea).lineHeight || '18'));
		}
		return box;
	}

	/* ---- Devices page ---- */
	function deviceTable(devices, highlightJob) {
		return h('div', { class: 'table-wrap' }, h('table', { id: 'devices-table', class: 'stack' },
			h('thead', {}, h('tr', {}, ['Id', 'Device', 'Kind', 'Memory used', 'Job'].map((t) => h('th', { text: t })))),
			h('tbody', {}, devices.map((d) => {
				const used = d.memory_total ? d.memory_total - (d.memory_free || 0) : null;
				return h('tr', { 'data-device': d.id, class: highlightJob && d.job === highlightJob ? 'mine' : '' },
					h('td', { 'data-label': 'Id', text: d.id }), h('td', { 'data-label': 'Device', text: d.name }),
					h('td', { 'data-label': 'Kind', text: d.kind }),
					h('td', { 'data-label': 'Memory used' }, d.memory_total ? [h('progress', { class: 'memory', max: d.memory_total, value: used,
						'aria-label': 'memory of device ' + d.id }), h('span', { class: 'pct', text: fmtBytes(used) + ' / ' + fmtBytes(d.memory_total) })] : '–'),
					h('td', { 'data-label': 'Job' }, d.job ? h('a', { href: '#/jobs/' + d.job, text: '#' + d.job }) : h('span', { class: 'muted', text: 'free' })));
			}))));
	}
	function devicesPage(main) {
		const ctl = new AbortController();
		const body = h('div', {}, h('p', { class: 'muted', text: 'Loading devices…' }));
		main.append(h('div', { class: 'card' }, h('h1', { text: 'Devices' }), body));
		poller(ctl.signal, 3000, async () => {
			const r = await api('/devices');
			body.replaceChildren(r.devices.length ? deviceTable(r.devices) : h('p', { class: 'muted', text: 'No devices.' }));
		});
		return () => ctl.abort();
	}

	/* ---- series data ---- */
	/* A series as the page keeps it: parallel arrays in step order.  min
	 * and max are the bucket envelope of downsampled answers (equal to the
	 * value where a point stands for itself). */
	function emptySeries() { return { steps: [], values: [], epochs: [], times: [], min: [], max: [] }; }
	function lowerBound(a, x) {
		let lo = 0, hi = a.length;
		while (lo < hi) { const mid = (lo + hi) >> 1; if (a[mid] < x) lo = mid + 1; else hi = mid; }
		return lo;
	}
	/* Merges an answer's series into store, keeping step order and
	 * skipping steps it already has. */
	function mergeSeries(store, series) {
		let added = 0;
		for (const [name, s] of Object.entries(series || {})) {
			const dst = store[name] || (store[name] = emptySeries());
			if (appendAll(dst, s)) { added += s.steps.length; continue; }
			for (let i = 0; i < s.steps.length; i++) {
				const step = s.steps[i], v = s.values[i];
				const pt = [step, v, s.epochs ? s.epochs[i] : null, s.times ? s.times[i] : null,
					s.min ? s.min[i] : v, s.max ? s.max[i] : v];
				const n = dst.steps.length;
				let at = n;
				if (n && step <= dst.steps[n - 1]) {
					at = lowerBound(dst.steps, step);
					if (dst.steps[at] === step) continue;
				}
				const keys = ['steps', 'values', 'epochs', 'times', 'min', 'max'];
				if (at === n) keys.forEach((k, j) => dst[k].push(pt[j]));
				else keys.forEach((k, j) => dst[k].splice(at, 0, pt[j]));
				added++;
			}
		}
		return added;
	}
	/* The common case, whole: every step of s (in increasing order) is
	 * past the last one dst has; appended column by column.  False, and
	 * dst unchanged, otherwise. */
	function appendAll(dst, s) {
		const steps = s.steps, n = steps.length;
		let prev = dst.steps.length ? dst.steps[dst.steps.length - 1] : -Infinity;
		for (let i = 0; i < n; i++) {
			if (!(steps[i] > prev)) return false;
			prev = steps[i];
		}
		const col = (k, from) => { if (from) for (let i = 0; i < n; i++) dst[k].push(from[i]); };
		const fill = (k, from, dflt) => { if (from) col(k, from); else for (let i = 0; i < n; i++) dst[k].push(dflt ? dflt[i] : null); };
		col('steps', steps);
		col('values', s.values);
		fill('epochs', s.epochs);
		fill('times', s.times);
		fill('min', s.min, s.values);
		fill('max', s.max, s.values);
		return true;
	}
	/* Halves s in place: its first point stays alone (as the daemon keeps
	 * a series' first point), then each pair becomes one bucket: the later
	 * point, with the pair's min and max, so a spike stays in the
	 * envelope; an odd last point stays as it is. */
	function compact(s) {
		const n = s.steps.length, lo = (a, b) => (a === null ? b : b === null ? a : Math.min(a, b));
		const hi = (a, b) => (a === null ? b : b === null ? a : Math.max(a, b));
		let w = 1;
		for (let i = 1; i < n; i += 2, w++) {
			const j = i + 1 < n ? i + 1 : i;
			s.steps[w] = s.steps[j]; s.values[w] = s.values[j]; s.epochs[w] = s.epochs[j]; s.times[w] = s.times[j];
			s.min[w] = lo(s.min[i], s.min[j]); s.max[w] = hi(s.max[i], s.max[j]);
		}
		for (const k of ['steps', 'values', 'epochs', 'times', 'min', 'max']) s[k].length = Math.min(n, w);
	}
	function bound(store) {
		for (const s of Object.values(store)) while (s.steps.length > 2 * MAX_POINTS) compact(s);
	}
	function lastStep(store) {
		let last = -1;
		for (const s of Object.values(store)) if (s.steps.length) last = Math.max(last, s.steps[s.steps.length - 1]);
		return last;
	}
	function pick(store, names) {
		const out = {};
		for (const n of names) if (store[n]) out[n] = store[n];
		return out;
	}
	/* An answer's points from each series' newest step in store on: a
	 * read from an older step (the series off the charts catch up from
	 * where they were) must not stitch its buckets between points the
	 * store already has. */
	function newPointsOnly(store, series) {
		const out = {};
		for (const [name, s] of Object.entries(series)) {
			const have = store[name];
			const k = have && have.steps.length ? lowerBound(s.steps, have.steps[have.steps.length - 1]) : 0;
			if (k === 0) { out[name] = s; continue; }
			const t = {};
			for (const [key, v] of Object.entries(s)) t[key] = Array.isArray(v) ? v.slice(k) : v;
			out[name] = t;
		}
		return out;
	}
	/* Steps per epoch as a store's points show it, or null: in its longest
	 * series, the steps between the first and the last point that begin a
	 * new epoch (a point's epoch is that of the step it ends), or with one
	 * such point, its step against the epochs before it.  Downsampled
	 * buckets show a boundary late by the same part of a bucket at both
	 * ends, so the difference stays close. */
	function epochLength(store) {
		let s = null;
		for (const c of Object.values(store || {})) if (!s || c.steps.length > s.steps.length) s = c;
		if (!s) return null;
		let i = -1, j = -1;
		for (let k = 1; k < s.steps.length; k++)
			if (s.epochs[k] !== null && s.epochs[k - 1] !== null && s.epochs[k] > s.epochs[k - 1]) { if (i < 0) i = k; j = k; }
		if (i < 0) return null;
		if (j > i) return (s.steps[j] - s.steps[i]) / (s.epochs[j] - s.epochs[i]);
		return s.epochs[i] > 0 ? (s.steps[i] - 1) / s.epochs[i] : null;
	}
	/* TensorBoard's smoothing: an EMA debiased by 1 - w^n, so the first
	 * points are not dragged towards zero. */
	const SMOOTH_MIN_POINTS = 50;
	function ema(values, w) {
		const out = new Array(values.length);
		let last = 0, n = 0;
		for (let i = 0; i < values.length; i++) {
			const v = values[i];
			if (v === null || !isFinite(v)) { out[i] = v; continue; }
			last = last * w + (1 - w) * v;
			n++;
			out[i] = w === 0 ? v : last / (1 - Math.pow(w, n));
		}
		return out;
	}
	/* uPlot.join's result for tables whose x columns all ascend (steps,
	 * epochs and wall times do): one merge of the sorted x columns, where
	 * uPlot.join costs the page about as much as all the rest of a live
	 * redraw (bench/dashboard/RESULTS.md, section B).  A missing value is
	 * undefined, as uPlot.join leaves it (a gap the lines span). */
	function joinTables(tables) {
		const ascending = (xs) => { for (let i = 0; i < xs.length; i++) if (typeof xs[i] !== 'number' || (i && !(xs[i] > xs[i - 1]))) return false; return true; };
		if (!tables.every((t) => ascending(t[0]))) return uPlot.join(tables);
		const xs = [], at = tables.map(() => 0);
		for (;;) {
			let x = Infinity;
			tables.forEach((t, k) => { if (at[k] < t[0].length && t[0][at[k]] < x) x = t[0][at[k]]; });
			if (x === Infinity) break;
			xs.push(x);
			tables.forEach((t, k) => { if (at[k] < t[0].length && t[0][at[k]] === x) at[k]++; });
		}
		const out = [xs];
		for (const t of tables) {
			const cols = t.slice(1).map(() => new Array(xs.length).fill(undefined));
			for (let i = 0, j = 0; i < t[0].length; i++) {
				while (xs[j] !== t[0][i]) j++;
				for (let c = 0; c < cols.length; c++) cols[c][j] = t[c + 1][i];
			}
			out.push(...cols);
		}
		return out;
	}
	function metricsQuery(params) {
		const q = new URLSearchParams(Object.assign({ max_points: String(MAX_POINTS), epochs: 'true', times: 'true' }, params));
		return q.toString();
	}

	/* ---- Job page ---- */
	function jobPage(main, id) {
		const ctl = new AbortController(), signal = ctl.signal;
		const st = {
			job: null, series: {}, overlays: new Map(), charts: [], x: 'step', log: false, smooth: 0.6, envelope: true,
			logLines: [], polling: false, role: null,
		};
		/* ---- layout ---- */
		const title = h('h1', { id: 'job-title', text: 'Job #' + id });
		const badge = h('span', { id: 'job-state' });
		/* A trial of an experiment links back to it. */
		const trialOf = h('span', { id: 'job-experiment', class: 'muted' });
		const buttons = {};
		const actions = h('div', { class: 'row', id: 'job-actions' });
		/* A resume may give the job a new end: epochs in all (empty: unchanged). */
		const resumeEpochs = h('input', { type: 'number', id: 'resume-epochs', min: 1, step: 1, class: 'small-num',
			placeholder: 'epochs', title: 'Resume to this many epochs in all (empty: as before)',
			'aria-label': 'Epochs in all when resumed (optional)', disabled: true });
		const ACTIONS = [
			['stop', 'Stop', 'finishes its current step, takes a final checkpoint and ends as stopped (it can be resumed later)', ['running']],
			['pause', 'Pause', 'takes a checkpoint and leaves its devices until resumed', ['queued', 'running', 'preempted']],
			['resume', 'Resume', 'queues it again; it continues from its newest checkpoint', ['paused', 'stopped']],
			['cancel', 'Cancel', 'ends it at once, without a final checkpoint', ['queued', 'running', 'stopping', 'paused', 'interrupted', 'preempted']],
		];
		for (const [op, label, what, states] of ACTIONS) {
			const b = h('button', { type: 'button', id: 'btn-' + op, class: op === 'cancel' ? 'danger' : '', text: label, disabled: true });
			b.dataset.states = states.join(' ');
			b.addEventListener('click', () => control(op, label, what, b));
			buttons[op] = b;
			actions.append(b);
			if (op === 'resume') actions.append(resumeEpochs);
		}
		const feedback = h('span', { id: 'job-feedback', class: 'muted small', role: 'status', 'aria-live': 'polite' });
		const info = h('dl', { class: 'info', id: 'job-info' });
		const devPanel = h('div', { id: 'job-devices' }, h('p', { class: 'muted', text: '–' }));
		const ckptPanel = h('div', { id: 'job-checkpoints' }, h('p', { class: 'muted', text: 'none yet' }));
		const logPre = h('pre', { class: 'log', id: 'job-log', tabindex: '0', 'aria-label': 'log tail' });
		const chartsBox = h('div', { id: 'charts' });

		const xSel = h('select', { id: 'x-axis', 'aria-label': 'X axis' },
			h('option', { value: 'step', text: 'step' }), h('option', { value: 'epoch', text: 'epoch' }), h('option', { value: 'time', text: 'wall time (s)' }));
		const ySel = h('select', { id: 'y-scale', 'aria-label': 'Y scale' },
			h('option', { value: 'linear', text: 'linear' }), h('option', { value: 'log', text: 'log' }));
		const smooth = h('input', { type: 'range', id: 'smoothing', min: 0, max: 0.99, step: 0.01, value: st.smooth, 'aria-label': 'Smoothing' });
		const smoothOut = h('output', { for: 'smoothing', text: st.smooth.toFixed(2) });
		const env = h('input', { type: 'checkbox', id: 'envelope', checked: true });
		const overlayIn = h('input', { type: 'number', id: 'overlay-job', min: 1, placeholder: 'job id', style: 'width:6.5rem', 'aria-label': 'Compare with job' });
		const overlayBtn = h('button', { type: 'button', id: 'overlay-add', text: 'Compare' });
		const addChartSel = h('select', { id: 'add-chart', 'aria-label': 'Add a chart of a series' }, h('option', { value: '', text: '+ chart of…' }));
		const overlayChips = h('span', { class: 'chips', id: 'overlay-chips' });

		main.append(
			h('div', { class: 'job-head' }, h('a', { href: '#/', text: '← Jobs' }), title, badge, trialOf, h('span', { class: 'spacer' }), feedback, actions),
			h('div', { class: 'job-grid' },
				h('div', {},
					h('div', { class: 'card controls', id: 'chart-controls' },
						h('label', {}, 'X ', xSel), h('label', {}, 'Y ', ySel),
						h('label', {}, 'Smoothing ', smooth, smoothOut),
						h('label', {}, env, 'min/max band'),
						h('span', { class: 'row' }, overlayIn, overlayBtn, overlayChips),
						addChartSel),
					chartsBox,
					h('div', { class: 'card log-card' }, h('h2', { text: 'Log' }), logPre)),
				h('aside', {},
					h('div', { class: 'card info-card' }, h('h2', { text: 'Info' }), info),
					h('div', { class: 'card' }, h('h2', { text: 'Devices' }), devPanel),
					h('div', { class: 'card' }, h('h2', { text: 'Checkpoints' }), ckptPanel))));

		/* ---- job info ---- */
		function renderJob() {
			const job = st.job, p = job.progress || {}, s = job.summary || {};
			title.textContent = '#' + job.id + ' ' + job.name;
			document.title = '#' + job.id + ' ' + job.name + ' – trainerd';
			badge.replaceChildren(stateBadge(job.state), preemptBadge(job) || '');
			if (job.experiment && !trialOf.firstChild)
				trialOf.append('trial ' + job.trial + ' of ', h('a', { href: '#/experiments/' + job.experiment, text: 'experiment #' + job.experiment }));
			/* A request's feedback lasts until the job has ended. */
			if (job.terminal && !Object.values(buttons).some((b) => b.dataset.busy)) feedback.textContent = '';
			/* A token whose role may not control jobs (GET /whoami) sees
			 * no controls; until its role is known they show, as before. */
			const may = st.role === null || roleAtLeast(st.role, 'write');
			for (const b of Object.values(buttons)) {
				b.hidden = !may;
				if (!b.dataset.busy) b.disabled = !b.dataset.states.split(' ').includes(job.state);
			}
			resumeEpochs.disabled = buttons.resume.disabled;
			resumeEpochs.hidden = !may;
			const rows = [
				['Step', (p.step || 0) + (p.total_steps ? ' / ' + p.total_steps : '')],
				/* 1-based for people; the engine's info field "epoch" is the
				 * last finished one, shown below as such. */
				['Current epoch', p.epoch === undefined ? null : p.epochs ? (p.epoch + 1) + ' / ' + p.epochs : p.epoch + 1],
				['ETA', job.terminal ? '–' : fmtDuration(p.eta_s)],
				['Elapsed', fmtDuration(p.elapsed_s !== undefined ? p.elapsed_s : job.started_at ? ((job.finished_at ? Date.parse(job.finished_at) : Date.now()) - Date.parse(job.started_at)) / 1000 : null)],
				['Loss (last step)', fmtNum(p.loss !== undefined && p.loss !== null ? p.loss : s.loss)],
				['Epoch loss (mean)', fmtNum(s.epoch_loss)],
				['Val loss', fmtNum(s.val_loss !== undefined ? s.val_loss : lastValue('val_loss'))],
				/* Only a classifier has an accuracy: a regression job
				 * showed a row of dashes. */
				...(classifier(job) ? [['Val accuracy', fmtNum(s.val_accuracy !== undefined ? s.val_accuracy : lastValue('val_accuracy'))]] : []),
				['Samples/s (run)', fmtNum(p.samples_per_sec !== undefined ? p.samples_per_sec : s.samples_per_sec, 0)],
				/* The last step's wait; its share of the step time is in the
				 * device panel. */
				['Data wait (ms/step)', fmtMs(s.data_wait_ms !== undefined ? s.data_wait_ms : lastValue('data_wait_ms'))],
				['Priority', job.priority + (job.preemptible ? ' (preemptible)' : '')],
				...(job.preemption ? [['Preempted', job.preemption.message]] : []),
				['Submitted', job.submitted_at ? age(job.submitted_at) + ' ago' : '–'],
				['Started', job.started_at ? age(job.started_at) + ' ago' : '–'],
				['Finished', job.finished_at ? age(job.finished_at) + ' ago' : '–'],
			];
			for (const [k, v] of Object.entries(job.info || {}))
				if (!IN_DEVICES_PANEL.has(k)) rows.push([INFO_LABELS.get(k) || k, v, k]);
			if (job.error) rows.push(['Error', job.error.code + ': ' + job.error.message + (job.error.step !== undefined ? ' (step ' + job.error.step + ')' : '')]);
			setRows(rows);
			/* A control's toast ("… is stopping") gives way to the state the
			 * job went on to. */
			if (st.toastFor && st.toastFor.state !== job.state) {
				toast(st.toastFor.label + ': job #' + id + ' is ' + job.state);
				st.toastFor = null;
			}
		}
		/* The engine's info fields (docs/design.md, "Monitors"), named for
		 * people; others show their own key.  A Map, not an object: a user's
		 * key "constructor", "__proto__" or "toString" would find a label in
		 * Object.prototype. */
		/* Info fields the Devices panel shows (named there), not listed twice. */
		const IN_DEVICES_PANEL = new Set(['conv_routes', 'dense_routes']);
		const INFO_LABELS = new Map([['epoch', 'Epochs finished'], ['phase', 'Phase'], ['best_val_loss', 'Best val loss'],
			['best_val_loss_step', 'Best val loss at step'], ['stop_reason', 'Stop reason']]);
		/* The rows change text every second: only changed text is written,
		 * and the list is rebuilt only when its keys change. */
		let rowKeys = '', rowCells = [];
		function setRows(rows) {
			const keys = rows.map((r) => r[0]).join('\n');
			const text = (v) => (v === undefined || v === null ? '–' : String(v));
			if (keys !== rowKeys) {
				rowKeys = keys;
				rowCells = rows.map(([k, v, key]) => h('dd', { text: text(v), 'data-key': key || null }));
				info.replaceChildren(...rows.flatMap(([k], i) => [h('dt', { text: k }), rowCells[i]]));
				return;
			}
			rows.forEach(([, v], i) => { if (rowCells[i].textContent !== text(v)) rowCells[i].textContent = text(v); });
		}
		/* softmax_cross_entropy is the default loss (docs/design.md, job
		 * spec); a job with a known accuracy is one whatever it says. */
		function classifier(job) {
			const m = (job.spec && job.spec.model) || {};
			const s = job.summary || {};
			return (m.loss || 'softmax_cross_entropy') === 'softmax_cross_entropy' || typeof s.val_accuracy === 'number';
		}
		function fmtPct(f) { return f === undefined || f === null ? '–' : (100 * f).toFixed(1) + '%'; }
		function lastValue(name) {
			const s = st.series[name];
			return s && s.values.length ? s.values[s.values.length - 1] : null;
		}
		async function loadJob() {
			await setJob(await api('/jobs/' + id));
		}
		/* Shows job as the page's job.  One that has just ended is shown
		 * only after one more metrics read, drawn at once: the daemon
		 * commits a job's points before its end state (docs/design.md,
		 * "The job"), so that read holds the last step, and the page never
		 * shows an ended job beside curves that stop short of it. */
		async function setJob(job) {
			const ended = job.terminal && st.job && !st.job.terminal;
			if (ended) {
				try { await readMetrics({ all: true }); } catch (e) { if (signal.aborted) throw e; }
				redrawAll(false);
			}
			st.job = job;
			renderJob();
			/* Its devices are no longer its own: say so at once. */
			if (ended) loadDevices().catch(() => {});
		}
		async function loadDevices() {
			const job = st.job;
			if (!job) return;
			const spec = job.spec || {};
			let devices = [];
			try { devices = (await api('/devices')).devices; } catch (e) { /* shown as ids only */ }
			const mine = devices.filter((d) => (job.devices || []).includes(d.id));
			const p = job.progress || {}, s = job.summary || {};
			const wait = p.data_wait_fraction !== undefined ? p.data_wait_fraction : s.data_wait_fraction;
			/* A device's memory is its current owner's: shown only while
			 * that is this job.  A job that ended (or paused) lists the
			 * devices it ran on. */
			const memory = (dv) => dv.job === job.id && dv.memory_total
				? ', ' + fmtBytes(dv.memory_total - (dv.memory_free || 0)) + ' / ' + fmtBytes(dv.memory_total) + ' used' : '';
			const ranOn = job.terminal || (mine.length > 0 && !mine.some((dv) => dv.job === job.id));
			devPanel.replaceChildren(
				h('dl', { class: 'info' },
					h('dt', { text: ranOn ? 'Ran on' : 'Devices' }), h('dd', { text: (job.devices || []).join(', ') || 'none yet' }),
					h('dt', { text: 'Backend' }), h('dd', { text: spec.backend || 'auto' }),
					/* What the trainer resolved, not what the spec says. */
					h('dt', { text: 'Loader threads' }), h('dd', { 'data-key': 'loader_threads', text: job.loader_threads ? String(job.loader_threads) : '–' }),
					h('dt', { text: 'Data-wait share' }), h('dd', { text: wait === undefined || wait === null ? '–' : fmtPct(wait) + ' of step time' }),
					/* CPU conv2d route per conv layer, as the job measured or was told */
					(job.info || {}).conv_routes ? [h('dt', { text: 'Conv routes' }),
						h('dd', { 'data-key': 'conv_routes', text: job.info.conv_routes.split(',').join(', ') })] : [],
					/* and each dense layer's: OpenBLAS or oneDNN tiles */
					(job.info || {}).dense_routes ? [h('dt', { text: 'Dense routes' }),
						h('dd', { 'data-key': 'dense_routes', text: job.info.dense_routes.split(',').join(', ') })] : [],
					mine.flatMap((dv) => [h('dt', { text: dv.name }),
						h('dd', { 'data-device': dv.id, text: dv.kind + memory(dv) })])));
		}
		async function loadCheckpoints() {
			const r = await api('/jobs/' + id + '/checkpoints');
			if (!r.checkpoints.length) { ckptPanel.replaceChildren(h('p', { class: 'muted', text: 'none yet' })); return; }
			ckptPanel.replaceChildren(h('div', { class: 'table-wrap' }, h('table', {},
				h('thead', {}, h('tr', {}, ['Step', 'Size', 'Download'].map((t) => h('th', { text: t })))),
				h('tbody', {}, r.checkpoints.map((c) => h('tr', {},
					h('td', { text: c.step, title: c.created_at }), h('td', { text: fmtBytes(c.bytes) }),
					h('td', {}, download('/jobs/' + id + '/checkpoints/' + c.step + '/model.safetensors', 'weights', 'job' + id + '-step' + c.step + '-model.safetensors'),
						' · ', download('/jobs/' + id + '/checkpoints/' + c.step + '/checkpoint.safetensors', 'full', 'job' + id + '-step' + c.step + '-checkpoint.safetensors'))))))));
		}
		/* A plain link without a token; with one, the click fetches the
		 * file with the Authorization header (a link cannot carry it). */
		function download(href, label, filename) {
			const a = h('a', { href, download: filename, text: label });
			a.addEventListener('click', async (ev) => {
				if (!sessionStorage.getItem(TOKEN_KEY)) return;
				ev.preventDefault();
				try {
					const r = await apiFetch(href);
					if (!r.ok) throw new Error('HTTP ' + r.status);
					const url = URL.createObjectURL(await r.blob());
					const tmp = h('a', { href: url, download: filename });
					document.body.append(tmp);
					tmp.click();
					tmp.remove();
					setTimeout(() => URL.revokeObjectURL(url), 10000);
				} catch (e) { toast('Download failed: ' + e.message, true); }
			});
			return a;
		}

		/* ---- controls ---- */
		async function control(op, label, what, b) {
			if (!(await confirmDialog('Job #' + id + ' ' + what + '.', label + ' job #' + id))) return;
			const old = b.textContent;
			b.dataset.busy = '1';
			b.disabled = true;
			b.textContent = label.replace(/e$/, '') + 'ing…';
			feedback.textContent = op + ' requested…';
			try {
				const epochs = op === 'resume' && resumeEpochs.value ? Number(resumeEpochs.value) : 0;
				await setJob(await api('/jobs/' + id + '/' + op, epochs
					? { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ epochs }) }
					: { method: 'POST' }));
				if (epochs) resumeEpochs.value = '';
				feedback.textContent = op + ' accepted: ' + st.job.state;
				toast(label + ': job #' + id + ' is ' + st.job.state);
				st.toastFor = { label, state: st.job.state };
			} catch (e) {
				feedback.textContent = '';
				toast(label + ' refused: ' + e.message, true);
			} finally {
				delete b.dataset.busy;
				b.textContent = old;
				if (st.job) renderJob();
			}
			startLive();
		}

		/* ---- charts ---- */
		function stepsPerEpoch(jid) {
			const o = jid ? st.overlays.get(jid) : null;
			const job = (o ? o.job : st.job) || {}, p = job.progress || {}, spec = job.spec || {};
			const epochs = p.epochs || spec.epochs;
			/* A job bounded by max_steps has no epoch count: its epoch
			 * length comes from where its points change epoch. */
			return epochs && p.total_steps ? p.total_steps / epochs : epochLength(o ? o.series : st.series);
		}
		/* jid: whose series (null: this job's); wall time counts from that
		 * job's own first point, so compared runs start together. */
		function xValues(s, jid) {
			if (st.x === 'epoch') {
				const spe = stepsPerEpoch(jid);
				return spe ? s.steps.map((x) => x / spe) : s.epochs.map((e, i) => (e === null ? s.steps[i] : e));
			}
			if (st.x === 'time') {
				const o = jid ? st.overlays.get(jid) : null;
				const t0 = firstTime(o ? o.series : st.series);
				return s.times.map((t) => (t === null ? null : t - t0));
			}
			return s.steps;
		}
		function firstTime(store) {
			let t0 = Infinity;
			for (const s of Object.values(store)) if (s.times.length && s.times[0] !== null) t0 = Math.min(t0, s.times[0]);
			return isFinite(t0) ? t0 : 0;
		}
		function allNames() {
			return Object.keys(st.series).sort();
		}
		function refreshPickers() {
			const names = allNames();
			const have = new Set([...addChartSel.options].map((o) => o.value));
			for (const n of names) if (!have.has(n)) addChartSel.append(h('option', { value: n, text: n }));
			for (const c of st.charts) c.refreshPicker(names);
		}
		function addChart(names) {
			const c = { names: names.slice(), u: null, zoom: null, key: '' };
			const el = h('div', { class: 'chart', 'data-chart': st.charts.length, 'data-points': '0' });
			const chips = h('span', { class: 'chips' });
			const picker = h('select', { 'aria-label': 'Add a series to this chart' }, h('option', { value: '', text: '+ series' }));
			const zoomNote = h('span', { class: 'zoom-note' });
			const reset = h('button', { type: 'button', class: 'reset-zoom', text: 'Reset zoom', hidden: true });
			const remove = h('button', { type: 'button', 'aria-label': 'Remove chart', text: 'Remove' });
			const card = h('div', { class: 'card chart-card' },
				h('div', { class: 'row' }, chips, picker, h('span', { class: 'spacer' }), zoomNote, reset, remove), el);
			c.el = el;
			c.card = card;
			c.refreshPicker = (all) => {
				const have = new Set([...picker.options].map((o) => o.value));
				for (const n of all) if (!have.has(n)) picker.append(h('option', { value: n, text: n }));
			};
			picker.addEventListener('change', () => {
				if (picker.value && !c.names.includes(picker.value)) {
					c.names.push(picker.value);
					c.zoom = null;
					/* It was read only every OTHERS_MS: catch up now. */
					if (live()) readMetrics({ all: true }).catch(() => {});
				}
				picker.value = '';
				draw(c, true);
			});
			remove.addEventListener('click', () => {
				if (c.u) c.u.destroy();
				card.remove();
				st.charts.splice(st.charts.indexOf(c), 1);
			});
			reset.addEventListener('click', () => { c.zoom = null; draw(c, true); });
			el.addEventListener('dblclick', () => { if (c.zoom) { c.zoom = null; draw(c, true); } });
			c.renderChips = (lines) => {
				chips.replaceChildren(...lines.map((ln) => h('span', { class: 'chip' },
					h('span', { class: 'sw', style: 'background:' + ln.color }), ln.label,
					h('span', { class: 'val', text: fmtNum(ln.last) }),
					h('button', { type: 'button', 'aria-label': 'remove ' + ln.label, text: '×', onclick: () => {
						c.names = c.names.filter((n) => n !== ln.name);
						draw(c, true);
					} }))));
				zoomNote.textContent = c.zoom ? 'steps ' + c.zoom.from + '–' + c.zoom.to + ' (full resolution)' : '';
				reset.hidden = !c.zoom;
			};
			st.charts.push(c);
			chartsBox.append(card);
			c.refreshPicker(allNames());
			draw(c, true);
			return c;
		}
		/* The lines of a chart: this job's series, then each compared job's. */
		function chartLines(c) {
			const lines = [];
			const sources = [[null, c.zoom ? c.zoom.series : st.series]];
			for (const [jid, o] of st.overlays) sources.push([jid, c.zoom ? (c.zoom.overlays[jid] || {}) : o.series]);
			c.names.forEach((name, k) => {
				for (const [n, [jid, store]] of sources.entries()) {
					const s = store[name];
					if (!s || !s.steps.length) continue;
					lines.push({ name, jid, s, label: (jid ? '#' + jid + ' ' : '') + name,
						/* A compared job: dashed, in a colour of its own. */
						color: PALETTE[(k + 4 * n + (n ? 1 : 0)) % PALETTE.length], dash: jid ? [6, 4] : null,
						last: s.values[s.values.length - 1] });
				}
			});
			return lines;
		}
		function draw(c, rebuild) {
			const lines = chartLines(c);
			c.renderChips(lines);
			const main = lines.find((l) => !l.jid);
			c.el.dataset.points = main ? String(main.s.steps.length) : '0';
			/* Each of this job's lines' last step, for the browser test:
			 * the newest point must never be missing from a curve. */
			c.el.dataset.lastSteps = JSON.stringify(Object.fromEntries(lines.filter((l) => !l.jid)
				.map((l) => [l.name, l.s.steps[l.s.steps.length - 1]])));
			/* For bench/dashboard: when the page first showed a curve. */
			if (main && !performance.getEntriesByName('trainerd:first-chart').length) performance.mark('trainerd:first-chart');
			const pos = (v) => (st.log && !(v > 0) ? null : v);
			const tables = [];
			const series = [{ label: st.x }];
			const bands = [];
			for (const ln of lines) {
				const xs = xValues(ln.s, ln.jid);
				/* A short series is drawn as it is: an EMA over a few
				 * points lags so far behind that its line ends well
				 * away from the last value. */
				const smoothOn = st.smooth > 0 && ln.s.values.length >= SMOOTH_MIN_POINTS;
				const raw = ln.s.values.map(pos);
				const table = [xs, raw];
				/* A line of one point draws nothing: its point is marked
				 * (a job that failed at its second step has one loss). */
				const dot = { show: ln.s.steps.length === 1, size: 7, fill: ln.color };
				series.push({ label: ln.label + (smoothOn ? ' (raw)' : ''), stroke: smoothOn ? ln.color + '40' : ln.color,
					width: 1, dash: ln.dash, spanGaps: true, points: smoothOn ? { show: false } : dot });
				if (smoothOn) {
					table.push(ema(ln.s.values, st.smooth).map(pos));
					series.push({ label: ln.label, stroke: ln.color, width: 1.6, dash: ln.dash, spanGaps: true, points: dot });
				}
				const hasEnv = st.envelope && ln.s.min.some((v, i) => v !== ln.s.max[i]);
				if (hasEnv) {
					table.push(ln.s.max.map(pos), ln.s.min.map(pos));
					const hi = series.length, lo = hi + 1;
					series.push({ label: ln.label + ' max', stroke: 'transparent', width: 0, spanGaps: true, points: { show: false } },
						{ label: ln.label + ' min', stroke: 'transparent', width: 0, spanGaps: true, points: { show: false } });
					bands.push({ series: [hi, lo], fill: ln.color + '26' });
				}
				tables.push(table);
			}
			const data = tables.length === 1 ? tables[0] : tables.length ? joinTables(tables) : [[]];
			const key = series.map((s) => s.label).join('|') + '|' + st.log + '|' + st.x;
			if (c.u && !rebuild && key === c.key) {
				c.u.setData(data, !c.zoom);
				return;
			}
			if (c.u) c.u.destroy();
			c.key = key;
			const width = Math.max(280, c.el.clientWidth || chartsBox.clientWidth || 600);
			c.u = new uPlot({
				width, height: width < 500 ? 220 : 300,
				scales: { x: { time: false }, y: { distr: st.log ? 3 : 1 } },
				series, bands,
				legend: { show: false },
				axes: [{ label: st.x === 'time' ? 'seconds' : st.x, stroke: getComputedStyle(document.body).color,
					grid: { stroke: '#8882' } },
				{ stroke: getComputedStyle(document.body).color, grid: { stroke: '#8882' }, size: 60 }],
				cursor: { drag: { x: true, y: false, setScale: false } },
				hooks: { setSelect: [(u) => {
					if (u.select.width < 4) return;
					const x0 = u.posToVal(u.select.left, 'x'), x1 = u.posToVal(u.select.left + u.select.width, 'x');
					u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
					zoom(c, x0, x1);
				}] },
			}, data, c.el);
			c.el.uplot = c.u; /* for the browser test: what is drawn */
		}
		/* Drag to zoom: the x range becomes a step range, fetched again at
		 * full resolution (max_points still caps a huge range). */
		async function zoom(c, x0, x1) {
			const ref = (chartLines(c).find((l) => !l.jid) || {}).s || Object.values(st.series)[0];
			if (!ref) return;
			const xs = xValues(ref, null);
			let from = Infinity, to = -Infinity;
			for (let i = 0; i < xs.length; i++)
				if (xs[i] !== null && xs[i] >= x0 && xs[i] <= x1) { from = Math.min(from, ref.steps[i]); to = Math.max(to, ref.steps[i]); }
			if (st.x === 'step') { from = Math.max(0, Math.ceil(x0)); to = Math.floor(x1); }
			if (!isFinite(from) || to < from) return;
			const q = { names: c.names.join(','), from_step: String(from), to_step: String(to) };
			const z = { from, to, series: {}, overlays: {} };
			try {
				mergeSeries(z.series, (await api('/jobs/' + id + '/metrics?' + metricsQuery(q), { signal })).series);
				for (const jid of st.overlays.keys()) {
					z.overlays[jid] = {};
					mergeSeries(z.overlays[jid], (await api('/jobs/' + jid + '/metrics?' + metricsQuery(q), { signal })).series);
				}
			} catch (e) { if (!signal.aborted) toast('Zoom failed: ' + e.message, true); return; }
			c.zoom = z;
			draw(c, true);
		}
		function redrawAll(rebuild) { for (const c of st.charts) draw(c, rebuild); }
		/* Live data is drawn at the next animation frame, once however many
		 * answers came before it, and not while the tab is hidden (no
		 * frames then; the poll rests too). */
		let redrawPending = false;
		function scheduleRedraw() {
			if (redrawPending) return;
			redrawPending = true;
			requestAnimationFrame(() => { redrawPending = false; if (!signal.aborted) redrawAll(false); });
		}
		xSel.addEventListener('change', () => { st.x = xSel.value; for (const c of st.charts) c.zoom = null; redrawAll(true); });
		ySel.addEventListener('change', () => { st.log = ySel.value === 'log'; redrawAll(true); });
		smooth.addEventListener('input', () => { st.smooth = Number(smooth.value); smoothOut.textContent = st.smooth.toFixed(2); redrawAll(true); });
		env.addEventListener('change', () => { st.envelope = env.checked; redrawAll(true); });
		addChartSel.addEventListener('change', () => { if (addChartSel.value) addChart([addChartSel.value]); addChartSel.value = ''; });
		overlayBtn.addEventListener('click', async () => {
			const jid = Number(overlayIn.value);
			if (!jid || jid === id || st.overlays.has(jid)) return;
			try {
				const store = {};
				mergeSeries(store, (await api('/jobs/' + jid + '/metrics?' + metricsQuery({}), { signal })).series);
				/* Its own epoch length, for x by epoch. */
				const other = await api('/jobs/' + jid, { signal }).catch(() => null);
				st.overlays.set(jid, { series: store, job: other });
				overlayChips.append(h('span', { class: 'chip' }, '#' + jid, h('button', { type: 'button', 'aria-label': 'stop comparing with #' + jid, text: '×',
					onclick: (ev) => { st.overlays.delete(jid); ev.target.parentNode.remove(); redrawAll(true); } })));
				overlayIn.value = '';
				redrawAll(true);
			} catch (e) { toast('Job #' + jid + ': ' + e.message, true); }
		});
		let resizeTimer = null;
		const onResize = () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(() => redrawAll(true), 150); };
		window.addEventListener('resize', onResize);

		/* ---- live data ---- */
		/* The first read, in stages, so the first chart does not wait for
		 * every series of a long job (each costs the daemon's downsampling
		 * and its share of the answer): every series' first and last point
		 * (cheap: the names, and the newest step, which bounds every stage so
		 * that the stages are one snapshot and polling goes on from there);
		 * the default chart's series and the chart; every other series
		 * after it.  A series is read whole once: two downsampled answers of
		 * one series are not merged. */
		async function loadFirst() {
			const heads = (await api('/jobs/' + id + '/metrics?max_points=2', { signal })).series || {};
			const names = Object.keys(heads).sort();
			let upTo = -1;
			for (const s of Object.values(heads)) if (s.steps.length) upTo = Math.max(upTo, s.steps[s.steps.length - 1]);
			if (upTo < 0) return;
			const get = (some) => api('/jobs/' + id + '/metrics?' + metricsQuery({ names: some.join(','), to_step: String(upTo) }), { signal });
			const preferred = ['loss', 'val_loss'].filter((n) => heads[n]);
			const first = preferred.length ? preferred : names.slice(0, 1);
			mergeSeries(st.series, (await get(first)).series);
			if (!st.charts.length && Object.keys(st.series).length) addChart(first);
			refreshPickers();
			/* A few names a request: an answer holds each series whole. */
			const rest = names.filter((n) => !first.includes(n));
			for (let i = 0; i < rest.length; i += 8) {
				if (mergeSeries(st.series, (await get(rest.slice(i, i + 8))).series)) {
					refreshPickers();
					scheduleRedraw();
				}
			}
		}
		/* How many points a poll asks for: the new steps' share of the
		 * curve's MAX_POINTS (the job's step, from its last read, against
		 * the page's first step), so the curve keeps about the density of
		 * its first read and an answer stays small: one second of a long
		 * job is a few points, whatever its step rate. */
		function incrPoints(last) {
			const now = st.job && st.job.progress ? st.job.progress.step : null;
			let first = Infinity;
			for (const s of Object.values(st.series)) if (s.steps.length) first = Math.min(first, s.steps[0]);
			if (!(now > last) || !(last > first)) return INCR_POINTS;
			return Math.max(16, Math.min(INCR_POINTS, Math.ceil((MAX_POINTS * (now - last)) / (now - first))));
		}
		/* One metrics read at a time, after the first one: two reads from
		 * the same step would both add the same new steps. */
		let metricsRead = Promise.resolve(0);
		function readMetrics(opts) {
			metricsRead = metricsRead.catch(() => 0).then(() => pollMetrics(opts));
			return metricsRead;
		}
		/* Metrics after the first read: the steps from the newest one the
		 * page has.  That step is read again (its points the page has are
		 * skipped): a step's points need not be committed at once, and
		 * those written after its evaluation (val_loss, val_accuracy)
		 * come last; steps only grow, so none can come earlier than it.
		 *
		 * Each second only the series on a chart are read; the others
		 * (and series that are new to the page) every OTHERS_MS, from the
		 * newest step the previous such read had, and whenever a series is
		 * put on a chart.  A job's every-step series cost the daemon per
		 * read, and the info panel's figures come with the job
		 * (docs/design.md, "Dashboard"). */
		let othersFrom = -1, othersAt = 0;
		function shownNames() {
			const names = new Set();
			for (const c of st.charts) for (const n of c.names) if (st.series[n]) names.add(n);
			return [...names];
		}
		async function pollMetrics(opts) {
			const shown = shownNames();
			const all = !shown.length || othersFrom < 0 || (opts && opts.all) || performance.now() - othersAt >= OTHERS_MS;
			const last = all ? (othersFrom >= 0 ? othersFrom : lastStep(st.series)) : lastStep(pick(st.series, shown));
			const r = await api('/jobs/' + id + '/metrics?' + metricsQuery(Object.assign(all ? {} : { names: shown.join(',') },
				last > 0 ? { from_step: String(last), max_points: String(incrPoints(last)) } : {})), { signal });
			const got = r.series || {};
			if (all) {
				othersAt = performance.now();
				othersFrom = Math.max(last, lastStep(got));
			}
			const added = mergeSeries(st.series, newPointsOnly(st.series, got));
			bound(st.series);
			if (!st.charts.length && Object.keys(st.series).length) {
				const first = ['loss', 'val_loss'].filter((n) => st.series[n]);
				addChart(first.length ? first : [allNames()[0]]);
			}
			refreshPickers();
			if (added) scheduleRedraw();
			return added;
		}
		/* Lines are added at the next animation frame, all that came since
		 * the last one at once: a job logging every few milliseconds costs
		 * one layout a frame, not one per line (reading the scroll
		 * position after each append forces a layout). */
		let logQueue = [];
		function addLog(line) {
			logQueue.push(line);
			if (logQueue.length > LOG_LINES) logQueue = logQueue.slice(-LOG_LINES);
			if (logQueue.length === 1) requestAnimationFrame(flushLog);
		}
		function flushLog() {
			const lines = logQueue;
			logQueue = [];
			if (!lines.length || signal.aborted) return;
			const atEnd = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 4;
			const frag = document.createDocumentFragment();
			for (const line of lines) {
				const t = new Date(line.time); /* RFC 3339 */
				frag.append(h('div', { class: 'lvl-' + line.level },
					t.toTimeString().slice(0, 8) + ' ' + (LEVELS[line.level] || line.level).padEnd(6) + ' ' + line.message));
			}
			logPre.append(frag);
			for (let extra = logPre.childNodes.length - LOG_LINES; extra > 0; extra--) logPre.firstChild.remove();
			if (atEnd) logPre.scrollTop = logPre.scrollHeight;
		}
		/* Logs of a job that is over: the last page's lines. */
		async function loadLogsOnce() {
			let after = null, lines = [];
			for (let page = 0; page < 50; page++) {
				const r = await api('/jobs/' + id + '/logs?limit=10000' + (after ? '&after=' + after : ''), { signal });
				lines = lines.concat(r.logs).slice(-LOG_LINES);
				if (!r.next) break;
				after = r.next;
			}
			logPre.replaceChildren();
			lines.forEach(addLog);
		}
		/* Server-Sent Events read with fetch(), which, unlike EventSource,
		 * can send the Authorization header; reconnects resume with
		 * Last-Event-ID. */
		let lastEventId = null, streaming = false, ckptTimer = null;
		async function followEvents() {
			if (streaming) return;
			streaming = true;
			let retry = 3000;
			try {
				while (!signal.aborted) {
					let ended = false;
					try {
						const headers = { Accept: 'text/event-stream' };
						if (lastEventId !== null) headers['Last-Event-ID'] = lastEventId;
						/* State and log only: the curves come from the metrics
						 * polls, downsampled, instead of every raw point. */
						const r = await apiFetch('/jobs/' + id + '/events?types=state,log', { headers, signal });
						if (!r.ok) throw new ApiError(r.status, null);
						setConn('live');
						const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
						let buf = '';
						for (;;) {
							const { value, done } = await reader.read();
							if (done) break;
							buf += value;
							let cut;
							while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
								const frame = buf.slice(0, cut);
								buf = buf.slice(cut + (buf[cut] === '\r' ? 4 : 2));
								const ev = { type: 'message', data: [] };
								for (const line of frame.split(/\r?\n/)) {
									if (!line || line[0] === ':') continue;
									const k = line.indexOf(':');
									const field = k < 0 ? line : line.slice(0, k);
									const val = k < 0 ? '' : line.slice(k + (line[k + 1] === ' ' ? 2 : 1));
									if (field === 'id') ev.id = val;
									else if (field === 'event') ev.type = val;
									else if (field === 'data') ev.data.push(val);
									else if (field === 'retry' && /^\d+$/.test(val)) retry = Number(val);
								}
								if (ev.id !== undefined) lastEventId = ev.id;
								if (ev.data.length) onEvent(ev.type, ev.data.join('\n'));
							}
						}
						ended = true;
					} catch (e) {
						if (signal.aborted) return;
						setConn('reconnecting…');
					}
					if (ended && st.job && st.job.terminal) { setConn(''); return; }
					await sleep(retry, signal);
				}
			} finally { streaming = false; }
		}
		function onEvent(type, data) {
			let d;
			try { d = JSON.parse(data); } catch (e) { return; }
			if (type === 'log') {
				addLog(d);
				/* A new checkpoint is announced in the log: list it now. */
				if (/^checkpoint at step \d+ \(/.test(d.message || '')) {
					clearTimeout(ckptTimer);
					ckptTimer = setTimeout(() => loadCheckpoints().catch(() => {}), 300);
				}
			}
			else if (type === 'state') {
				if (st.job && st.job.state !== d.state) {
					/* An end is shown by loadJob, after the last points
					 * (an event without `terminal`, from an older daemon,
					 * is left to loadJob too). */
					if (d.terminal === false) {
						st.job.state = d.state;
						if (d.error !== undefined) st.job.error = d.error;
						renderJob();
						feedback.textContent = '';
					}
					loadJob().catch(() => {});
				}
			}
		}
		const live = () => st.job && !st.job.terminal;
		function startLive() {
			if (live()) followEvents();
			if (st.polling) return;
			st.polling = true;
			/* Metrics every second while the job can still write; a last
			 * read after it ended picks up the final flush. */
			(async () => {
				let finalReads = 0, wait = POLL_MS;
				while (!signal.aborted && finalReads < 2) {
					if (!document.hidden) {
						let added = 0;
						try { added = await readMetrics({ all: !live() }); } catch (e) { if (signal.aborted) return; }
						try { await loadJob(); } catch (e) { if (signal.aborted) return; }
						wait = added ? POLL_MS : Math.min(POLL_MAX_MS, wait * 2);
					}
					if (!live()) { finalReads++; wait = POLL_MS; }
					await sleep(wait, signal);
				}
				st.polling = false;
				if (!signal.aborted) { loadCheckpoints().catch(() => {}); loadDevices().catch(() => {}); }
			})();
		}

		(async () => {
			/* The metrics read is the slow one: start it beside the job's. */
			/* Failed half-way: the first poll reads everything again. */
			const firstMetrics = loadFirst().catch(() => { if (!signal.aborted) st.series = {}; });
			metricsRead = firstMetrics;
			try {
				await loadJob();
			} catch (e) {
				main.replaceChildren(h('div', { class: 'card error-box', role: 'alert' },
					h('strong', { text: 'Job #' + id + ': ' }), e.message, ' ', h('a', { href: '#/', text: 'back to jobs' })));
				return;
			}
			loadDevices().catch(() => {});
			loadCheckpoints().catch(() => {});
			myRole().then((role) => { st.role = role; if (st.job) renderJob(); }, () => {});
			await firstMetrics;
			if (signal.aborted) return;
			if (!live()) loadLogsOnce().catch(() => {});
			startLive();
			/* New checkpoints are announced in the log (onEvent), so this
			 * only catches pruning and device memory. */
			poller(signal, () => (live() ? 15000 : 60000), async () => { await loadCheckpoints(); await loadDevices(); });
		})();
		return () => {
			ctl.abort();
			window.removeEventListener('resize', onResize);
			for (const c of st.charts) if (c.u) c.u.destroy();
			document.title = 'trainerd';
		};
	}

	/* The pure pieces, for the browser test to check against direct
	 * computations. */
	window.trainerdDashboard = Object.freeze({ ema, fmtMs, pointerMap, mergeSeries, compact, joinTables, epochLength, SMOOTH_MIN_POINTS });

	/* For the dashboard's other files (experiments.js): the helpers they
	 * share with these pages. */
	window.trainerdUi = Object.freeze({ h, $, api, ApiError, poller, stateBadge, fmtNum, fmtDuration, age, toast,
		confirmDialog, myRole, roleAtLeast, joinTables, setConn, addPage, PALETTE });

	window.addEventListener('hashchange', route);
	/* After every script of the page has added its pages. */
	if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', route, { once: true });
	else route();
})();
