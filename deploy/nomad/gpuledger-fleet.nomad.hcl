# Rendered by gpuledger render 0.1.0: change the values and render again rather than edit this file.
# The fleet controller: every node controller and Nomad's GPU nodes in one view.

variable "checksum" {
  type        = string
  description = "sha256: and the hex digest of the release file, from its SHA256SUMS"
  validation {
    condition     = strlen(var.checksum) == 71 && regex_replace(var.checksum, "^sha256:[0-9a-fA-F]{64}$", "") == ""
    error_message = "The checksum must be sha256: and the 64 hex digits of the release file, as its SHA256SUMS gives them."
  }
}

job "gpuledger-fleet" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  node_pool   = "default"

  update {
    max_parallel      = 1
    min_healthy_time  = "10s"
    healthy_deadline  = "5m"
    progress_deadline = "10m"
    auto_revert       = true
  }

  group "fleet" {
    count = 1

    network {
      port "http" {
        static = 9878
      }
    }

    service {
      provider = "nomad"
      name     = "gpuledger-fleet"
      port     = "http"
      tags     = ["gpuledger-fleet"]

      check {
        type     = "http"
        path     = "/healthz"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "fleet" {
      driver       = "raw_exec"
      kill_signal  = "SIGTERM"
      kill_timeout = "10s"

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
          {{- if nomadVarExists "nomad/jobs/gpuledger-fleet" -}}
          {{- with nomadVar "nomad/jobs/gpuledger-fleet" -}}
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
          {{- if nomadVarExists "nomad/jobs/gpuledger-fleet" -}}
          {{- with nomadVar "nomad/jobs/gpuledger-fleet" -}}
          {{- (index . "nomad_token").Value -}}
          {{- end -}}
          {{- end -}}
        EOT
      }

      env {
        PEX_ROOT = "${NOMAD_TASK_DIR}/.pex"
      }

      config {
        command = "/usr/bin/python3"
        args    = [
          "${NOMAD_TASK_DIR}/gpuledger.pex",
          "fleet",
          "serve",
          "--listen",
          "${NOMAD_ADDR_http}",
          "--interval",
          "30s",
          "--shard",
          "${NOMAD_ALLOC_INDEX}/1",
          "--nomad-service",
          "gpuledger",
          "--nomad-namespace",
          "default",
          "--policy",
          "${NOMAD_TASK_DIR}/policy.yaml",
          "--nomad-token-file",
          "${NOMAD_SECRETS_DIR}/nomad_token",
        ]
      }

      resources {
        cpu    = 200
        memory = 512
      }
    }
  }
}
