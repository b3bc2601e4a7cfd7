/* `trainctl manifest --kubernetes`: a job spec as Kubernetes objects
 * (docs/clusters.md, "Kubernetes").
 *
 * Three objects: a ConfigMap with the normalized spec and the pods'
 * script (and, for several processes, Open MPI's hostfile), a headless
 * Service (clusterIP: None) whose name is the pods' DNS subdomain, and an
 * Indexed Job of `processes` pods (completions = parallelism), one rank
 * each.  Pod 0 runs `trainerd run`, which starts the ranks through
 * mpirun; mpirun reaches pods 1.. over ssh at NAME-I.NAME.NAMESPACE.svc.
 * Built offline from the spec file: no daemon and no cluster is asked.
 */
#ifndef TR_CLI_K8S_MANIFEST_H
#define TR_CLI_K8S_MANIFEST_H

#include <jansson.h>
#include <stddef.h>

#include "engine/spec.h"

#define TR_K8S_DEFAULT_NAMESPACE "default"
#define TR_K8S_DEFAULT_VOLUME "trainerd-data"
#define TR_K8S_DEFAULT_SSH_SECRET "trainerd-ssh"
/* Where the pods mount the data volume (their working directory: the
 * spec's relative paths name files on the volume), and the job's outputs
 * beneath it. */
#define TR_K8S_DATA_DIR "/data"
#define TR_K8S_OUT_DIR TR_K8S_DATA_DIR "/trainerd"
/* The port of the pods' sshd (not 22: it needs no privilege). */
#define TR_K8S_SSH_PORT 2222
/* Exit status of pod 0 when the run stopped with a checkpoint before its
 * end (the pod was asked to terminate): the Job's pod failure policy
 * ignores it and makes a new pod 0, which resumes (EX_TEMPFAIL). */
#define TR_K8S_EXIT_RESUME 75
/* Seconds between a pod's TERM and its KILL: one step and a checkpoint,
 * as Slurm's --signal lead (daemon/slurm.h). */
#define TR_K8S_GRACE_S 120
/* Failed pods (not evictions, not resumes) before the Job fails. */
#define TR_K8S_BACKOFF_LIMIT 3

struct tr_k8s_options {
	const char *name;        /* the objects' name; NULL: from the spec's name */
	const char *namespace_;  /* NULL: TR_K8S_DEFAULT_NAMESPACE */
	const char *image;       /* NULL: trainerd:VERSION */
	const char *data_volume; /* a PersistentVolumeClaim; NULL: TR_K8S_DEFAULT_VOLUME */
	const char *ssh_secret;  /* several processes: the Secret with the ssh keys */
	int gpus_per_pod;        /* nvidia.com/gpu per pod; 0 = CPU devices */
};

/* The objects of spec (parsed and valid) as a new JSON array, or NULL
 * with the reason in err: a flag's problem starts with the flag
 * ("--name: ..."), a spec's with its JSON pointer ("/processes: ..."). */
json_t *tr_k8s_manifest(const struct tr_spec *spec, const struct tr_k8s_options *o, char *err, size_t errlen);

#endif
