// Chart library render-time benchmark for the dashboard (bench/dashboard/
// RESULTS.md): four series of 100,000 points each, drawn by each candidate
// library in headless Debian chromium, timed from the constructor call to
// the second animation frame after it (so the canvas has been painted).
// Each library gets its recommended fast settings (no animation, no point
// markers, pre-parsed data).  Median of --runs runs, each in a fresh page.
//
// Usage: node bench/dashboard/chart_render.mjs [--runs 7] [--points 100000]
// Needs: scripts/install-deps.sh (chromium, libjs-dygraphs, libjs-chart.js,
// and node_modules/ with uplot and playwright-core).
import { chromium } from 'playwright-core';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import fs from 'node:fs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const args = process.argv.slice(2);
const opt = (name, def) => {
	const i = args.indexOf(name);
	return i >= 0 ? Number(args[i + 1]) : def;
};
const RUNS = opt('--runs', 7), POINTS = opt('--points', 100000), SERIES = 4;

const libs = [
	{ name: 'uPlot', version: JSON.parse(fs.readFileSync(path.join(root, 'node_modules/uplot/package.json'))).version,
	  source: 'npm uplot', scripts: [path.join(root, 'node_modules/uplot/dist/uPlot.iife.min.js')],
	  css: path.join(root, 'node_modules/uplot/dist/uPlot.min.css'), draw: 'uplot' },
	{ name: 'dygraphs', version: '2.2.1', source: 'Debian libjs-dygraphs',
	  scripts: ['/usr/share/javascript/dygraphs/dygraph.min.js'], draw: 'dygraphs' },
	{ name: 'Chart.js', version: '3.9.1', source: 'Debian libjs-chart.js',
	  scripts: ['/usr/share/javascript/chart.js/chart.min.js'], draw: 'chartjs' },
	{ name: 'Chart.js + decimation', version: '3.9.1', source: 'Debian libjs-chart.js',
	  scripts: ['/usr/share/javascript/chart.js/chart.min.js'], draw: 'chartjs-decimate' },
];

// Runs in the page: builds the data, then times one chart's first render.
async function drawOnce({ draw, points, series }) {
	const xs = new Float64Array(points);
	const ys = [];
	for (let i = 0; i < points; i++) xs[i] = i + 1;
	for (let s = 0; s < series; s++) {
		const y = new Float64Array(points);
		let v = 2.3 + s;
		for (let i = 0; i < points; i++) {
			v = v * 0.99995 + (Math.sin(i * 0.37 + s) * 0.05);
			y[i] = v;
		}
		ys.push(y);
	}
	const el = document.createElement('div');
	el.style.width = '900px';
	el.style.height = '360px';
	document.body.appendChild(el);
	const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
	const t0 = performance.now();
	if (draw === 'uplot') {
		const opts = { width: 900, height: 360, scales: { x: { time: false } },
			series: [{}].concat(ys.map((_, s) => ({ label: 's' + s, stroke: 'hsl(' + s * 90 + ',70%,45%)',
				points: { show: false } }))) };
		new uPlot(opts, [xs].concat(ys), el);
	} else if (draw === 'dygraphs') {
		const rows = new Array(points);
		for (let i = 0; i < points; i++) rows[i] = [xs[i], ys[0][i], ys[1][i], ys[2][i], ys[3][i]];
		new Dygraph(el, rows, { labels: ['x', 's0', 's1', 's2', 's3'], width: 900, height: 360 });
	} else {
		const canvas = document.createElement('canvas');
		el.appendChild(canvas);
		const datasets = ys.map((y, s) => {
			const data = new Array(points);
			for (let i = 0; i < points; i++) data[i] = { x: xs[i], y: y[i] };
			return { label: 's' + s, data, borderColor: 'hsl(' + s * 90 + ',70%,45%)', borderWidth: 1,
				pointRadius: 0, spanGaps: true };
		});
		new Chart(canvas, { type: 'line', data: { datasets }, options: {
			animation: false, parsing: false, normalized: true, responsive: false,
			scales: { x: { type: 'linear' } },
			plugins: { decimation: { enabled: draw === 'chartjs-decimate', algorithm: 'min-max' } } } });
	}
	await frame();
	await frame();
	return performance.now() - t0;
}

const median = (a) => { const s = [...a].sort((x, y) => x - y); return s[s.length >> 1]; };

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
	args: ['--no-sandbox', '--headless=new'] });
const rows = [];
try {
	for (const lib of libs) {
		const times = [];
		for (let r = 0; r < RUNS; r++) {
			const page = await browser.newPage({ viewport: { width: 1000, height: 500 } });
			await page.setContent('<!doctype html><html><body></body></html>');
			if (lib.css) await page.addStyleTag({ path: lib.css });
			for (const s of lib.scripts) await page.addScriptTag({ path: s });
			times.push(await page.evaluate(drawOnce, { draw: lib.draw, points: POINTS, series: SERIES }));
			await page.close();
		}
		rows.push({ ...lib, times, median: median(times) });
		console.error(`${lib.name}: median ${median(times).toFixed(1)} ms (${times.map((t) => t.toFixed(0)).join(', ')})`);
	}
} finally {
	await browser.close();
}
console.log(`| library | version | from | median ms (${SERIES} x ${POINTS} points, ${RUNS} runs) | min | max |`);
console.log('|---|---|---|---:|---:|---:|');
for (const r of rows)
	console.log(`| ${r.name} | ${r.version} | ${r.source} | ${r.median.toFixed(1)} | ${Math.min(...r.times).toFixed(1)} | ${Math.max(...r.times).toFixed(1)} |`);
