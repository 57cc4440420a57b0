# Rendered by gpuledger render 0.1.0: change the values and render again rather than edit this file.
# The node controller on every GPU node. It never requests a GPU: it observes them.
# It publishes node metadata, which needs node write: give its token the policy deploy/nomad/gpuledger-meta.policy.hcl too.

variable "checksum" {
  type        = string
  description = "sha256: and the hex digest of the release file, from its SHA256SUMS"
  validation {
    condition     = strlen(var.checksum) == 71 && regex_replace(var.checksum, "^sha256:[0-9a-fA-F]{64}$", "") == ""
    error_message = "The checksum must be sha256: and the 64 hex digits of the release file, as its SHA256SUMS gives them."
  }
}

job "gpuledger" {
  namespace   = "default"
  type        = "system"
  datacenters = ["*"]
  node_pool   = "default"

  constraint {
    attribute = "${meta.gpu}"
    value     = "true"
  }

  update {
    max_parallel     = 1
    min_healthy_time = "10s"
    healthy_deadline = "5m"
    auto_revert      = true
  }

  group "node" {
    network {
      port "http" {
        static = 9877
      }
    }

    # serve's history lives in alloc/data: a sticky disk carries it to the next allocation
    ephemeral_disk {
      sticky = true
    }

    service {
      provider = "consul"
      name     = "gpuledger"
      port     = "http"
      tags     = ["gpuledger", "node=${node.unique.name}"]

      check {
        type     = "http"
        path     = "/healthz"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "serve" {
      driver       = "docker"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      artifact {
        source      = "https://releases.example.com/gpuledger/0.1.0/gpuledger-0.1.0-linux-x86_64.pex"
        destination = "local/gpuledger.pex"
        mode        = "file"

        options {
          checksum = var.checksum
        }
      }

      # the policy from the Nomad Variable, key policy; without it, the built-in policy
      template {
        destination   = "local/policy.yaml"
        change_mode   = "signal"
        change_signal = "SIGHUP"
        data          = <<-EOT
          {{- if nomadVarExists "nomad/jobs/gpuledger" -}}
          {{- with nomadVar "nomad/jobs/gpuledger" -}}
          {{- with (index . "policy").Value }}{{ . }}{{ else }}version: 1{{ end -}}
          {{- end -}}
          {{- else }}version: 1{{ end }}
        EOT
      }

      # the token from the Nomad Variable, key nomad_token; without it, no token (no ACLs)
      template {
        destination = "secrets/nomad_token"
        change_mode = "noop"
        perms       = "0600"
        data        = <<-EOT
          {{- if nomadVarExists "nomad/jobs/gpuledger" -}}
          {{- with nomadVar "nomad/jobs/gpuledger" -}}
          {{- (index . "nomad_token").Value -}}
          {{- end -}}
          {{- end -}}
        EOT
      }

      env {
        NVIDIA_DRIVER_CAPABILITIES = "utility"
        NVIDIA_VISIBLE_DEVICES     = "all"
        PEX_ROOT                   = "${NOMAD_TASK_DIR}/.pex"
      }

      config {
        image   = "python:3.12-slim-bookworm"
        command = "python3"
        args    = [
          "${NOMAD_TASK_DIR}/gpuledger.pex",
          "serve",
          "--listen",
          ":${NOMAD_PORT_http}",
          "--interval",
          "15s",
          "--nomad-node-id",
          "${node.unique.id}",
          "--history",
          "${NOMAD_ALLOC_DIR}/data/history.json",
          "--policy",
          "${NOMAD_TASK_DIR}/policy.yaml",
          "--publish-node-meta",
          "--clear-node-meta-on-exit",
          "--nomad-token-file",
          "${NOMAD_SECRETS_DIR}/nomad_token",
          "--nomad-addr",
          "http://${attr.unique.network.ip-address}:4646",
        ]
        ports   = ["http"]

        # host PIDs and host cgroup paths, as the GPU driver and /proc report them
        pid_mode = "host"
        cgroupns = "host"
        runtime  = "nvidia"

        mount {
          type     = "bind"
          source   = "/var/run/docker.sock"
          target   = "/var/run/docker.sock"
          readonly = true
        }
      }

      resources {
        cpu    = 100
        memory = 256
      }
    }
  }
}
