typedef int tr_placeholder_t;
