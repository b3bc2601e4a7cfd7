/* placeholder: being written */
typedef int tr_placeholder_t;
