/* GET /whoami: the role the caller's token grants, so that a client (the
 * dashboard) offers only the controls it may use instead of buttons that
 * answer 403.  It names the role, never the token; a request without a
 * valid token never gets here when the daemon has tokens (401/403 from
 * api/auth.c, as for every read). */
#include "api/api_internal.h"

void tr_api_whoami(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	bool tokens = false;
	enum tr_api_role role = tr_api_auth_role(rq, &tokens);

	tr_api_reply_json(rp, 200, json_pack("{s:s, s:b}", "role", tr_api_role_name(role), "tokens", tokens));
}
