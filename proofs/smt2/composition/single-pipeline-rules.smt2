; placement-logic proof obligation: composition/single-pipeline-rules
; theorem: Composition
; single: pipeline: composition rules CR01–CR08 hold (3 plans)
;   for each of the 3 compositions P in the family: CR01(P) ∧ … ∧ CR08(P), for all mesh sizes
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun size_x () Int)
(declare-fun cr07_T_microbatches () Int)
(declare-fun cr07_t_microbatches () Int)
(declare-fun size_microbatches () Int)
(declare-fun cr07_agree_microbatches () Bool)
(assert
 (let ((?x0 (to_real 1)))
(let ((?x1 (+ (to_real cr07_t_microbatches) (to_real cr07_T_microbatches))))
(let (($x0 (or false (and (distinct (* (* 1.0 ?x0) ?x1) (* ?x1 ?x0)) true))))
(let (($x1 (= cr07_T_microbatches (* cr07_t_microbatches (- size_microbatches 1)))))
(let (($x2 (>= cr07_t_microbatches 1)))
(let (($x3 (= size_microbatches 1)))
(let (($x4 (=> $x3 cr07_agree_microbatches)))
(let (($x5 (and false)))
(let (($x6 (or $x5 $x5 $x5 $x5 $x5 (and (and false (>= size_microbatches 2))) (and $x4 $x2 $x1 $x0) (and (or (and (>= size_x 2) false))))))
(let (($x7 (>= size_microbatches 1)))
(let (($x8 (>= size_x 1)))
(let (($x9 (and $x8 $x7 $x6)))
(or $x9 $x9 $x9))))))))))))))
(check-sat)
(exit)
