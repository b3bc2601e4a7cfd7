/* The dashboard's files, compiled into the binary (docs/design.md §10):
 * api/ui/embed.py turns api/ui/ and the chart library's files into this
 * table at build time, so the daemon serves the dashboard without reading
 * anything at run time.
 */
#ifndef TR_API_UI_ASSETS_H
#define TR_API_UI_ASSETS_H

#include <stddef.h>

struct tr_ui_asset {
	const char *name;         /* served as /ui/<name>; "index.html" is GET / */
	const char *content_type; /* static string */
	const unsigned char *data;
	size_t len;
	const char *etag; /* strong ETag, quotes included */
};

extern const struct tr_ui_asset tr_ui_assets[];
extern const size_t tr_ui_asset_count;

#endif
