package kafka

import (
	"maps"
	"path/filepath"
)

// KIP405Props are a broker's properties for Kafka's own tiered storage
// (KIP-405), over props: the LocalTieredStorage remote storage manager
// (the kafka-storage test jar in KIP405LibDir) writing under dir, the
// default topic-based metadata manager with one partition and one
// replica, and the remote log manager's tasks every half second.
func KIP405Props(props map[string]string, dir string) map[string]string {
	out := map[string]string{
		"remote.log.storage.system.enable":                         "true",
		"remote.log.storage.manager.class.name":                    "org.apache.kafka.server.log.remote.storage.LocalTieredStorage",
		"remote.log.storage.manager.impl.prefix":                   "rsm.config.",
		"rsm.config.dir":                                           dir,
		"remote.log.metadata.manager.impl.prefix":                  "rlmm.config.",
		"remote.log.metadata.manager.listener.name":                "PLAINTEXT",
		"rlmm.config.remote.log.metadata.topic.replication.factor": "1",
		"rlmm.config.remote.log.metadata.topic.num.partitions":     "1",
		"remote.log.manager.task.interval.ms":                      "500",
	}
	maps.Copy(out, props)
	return out
}

// KIP405TopicConfigs are the configs of a topic in Kafka's own tiered
// storage whose local copies are deleted once copied (local.retention.bytes
// 1): consumers from offset 0 then read the remote storage.
func KIP405TopicConfigs() map[string]*string {
	yes, one := "true", "1"
	return map[string]*string{"remote.storage.enable": &yes, "local.retention.bytes": &one}
}

// KIP405Available says why Kafka's own tiered storage cannot run here
// (its kafka-storage test jar, with LocalTieredStorage, is not in
// KIP405LibDir), or "" if it can.
func KIP405Available() string {
	if m, _ := filepath.Glob(filepath.Join(KIP405LibDir(), "kafka-storage-*-test.jar")); len(m) == 0 {
		return "no Kafka tiered storage jars in " + KIP405LibDir() + " (scripts/install-deps fetches them)"
	}
	return ""
}
